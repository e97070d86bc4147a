// `expar plan`: per-rank memory and per-step communication for a model and training layout (seed 000 §5.1,
// equations 8 and 9). Only parses and prints; the computation is expar::plan_training
// (train/plan_buffers.hpp: topo/plan.hpp's make_plan plus the symmetric buffers sized as the trainer sizes
// them). With --expert-load, also the placement of redundant experts that DeepSeek's EPLB policy would choose
// for that load (topo/expert_balance.hpp), after the plan or, without a model, on its own.

#include "expar/topo/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/plan_inference.hpp"
#include "expar/cli/precision_flags.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/infer/rank_weights.hpp"
#include "expar/model/model_shape.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/topo/expert_balance.hpp"
#include "expar/topo/expert_balance_format.hpp"
#include "expar/topo/message_model.hpp"
#include "expar/topo/placement.hpp"
#include "expar/topo/plan_format.hpp"
#include "expar/train/plan_buffers.hpp"

namespace expar::cli {

namespace {

struct PlanOptions {
  std::string preset;
  std::string model;  // a checkpoint directory or its config.json / manifest.json (model/model_shape)
  // Explicit model shape; each overrides the preset's value when given.
  std::optional<int> layers, d_model, vocab, heads, kv_heads, head_dim, experts, top_k, expert_hidden;
  std::optional<int> shared_experts, shared_hidden, dense_layers, dense_hidden;
  int ranks = 1, ep = 1, cp = 1, tp = 1, pp = 1;
  std::string placement = "contiguous";
  std::string param_dtype = "bf16", grad_dtype = "f32", optimizer_dtype = "f32", activation_dtype = "bf16";
  int optimizer_states = 2;
  bool no_master_weights = false;
  bool shard_optimizer = false;
  int64_t tokens = 4096;
  int64_t seq_len = 0;  // 0: one sequence per rank (T * C)
  int microbatches = 1;
  double capacity_factor = 1.25;
  std::string capacity_policy = "source";
  bool recompute_moe = false;
  std::string path = "rowwise";
  PrecisionFlags precision;
  std::string products;  // --precision (as expar train); empty: the dtype flags alone
  double device_gib = 0;
  JsonOutput json;
  // The message model (topo/message_model.hpp); bandwidths in GB/s on the command line.
  MessageModelInputs messages;
  double link_gbytes = 50, memory_gbytes = 2000, node_gbytes = 450;
  // The inference plan (plan_inference.hpp): --kv-tokens selects it; --dp and --enable-expert-parallel are
  // its own, --tp, --ep and --placement mean what they mean for generate and serve.
  int64_t kv_tokens = 0;
  int dp = 1;
  bool enable_expert_parallel = false;
  double memory_limit_gib = 0;
  std::string weight_dtype;
  // The expert placement (topo/expert_balance.hpp): --expert-load selects it; --ep is the EP group size.
  std::string expert_load;
  int redundant_experts = 0;
  int expert_groups = 0;
};

// The flags a placement without a model reads; any other given is refused by name.
const std::vector<std::string> kPlacementOnlyFlags = {
    "--expert-load", "--redundant-experts", "--expert-groups", "--ep", "--ranks-per-node", "--json"};

// "8,1,1,2" -> {8, 1, 1, 2}: one finite, non-negative number per logical expert.
std::vector<double> parse_expert_load(const std::string& text) {
  std::vector<double> loads;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string entry = text.substr(begin, end - begin);
    const size_t expert = loads.size();
    const char* first = entry.c_str();
    char* last = nullptr;
    errno = 0;
    const double load = std::strtod(first, &last);
    const char* stop = last;
    const bool whole = !entry.empty() && stop != first &&
                       std::all_of(stop, first + entry.size(), [](char c) { return c == ' '; });
    EXPAR_CHECK(whole && errno == 0 && std::isfinite(load),
                "--expert-load: the load of expert {} is '{}', not a finite number: give one number >= 0 per "
                "logical expert, comma-separated (e.g. --expert-load 8,1,1,2)",
                expert, entry);
    EXPAR_CHECK(
        load >= 0,
        "--expert-load: the load of expert {} is {}: a load counts the tokens routed to the expert, so "
        "it is never negative: give 0 or more",
        expert, entry);
    loads.push_back(load);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return loads;
}

bool model_given(const PlanOptions& o) {
  return !o.preset.empty() || !o.model.empty() || o.layers || o.d_model || o.vocab || o.heads || o.kv_heads ||
         o.head_dim || o.experts || o.top_k || o.expert_hidden || o.shared_experts || o.shared_hidden ||
         o.dense_layers || o.dense_hidden;
}

// The placement of --expert-load over the EP group of --ep ranks; `model_experts` > 0: the loads must
// name that many experts. Nodes only when --ranks-per-node is given.
ExpertBalance plan_expert_balance(const PlanOptions& o, const CLI::App& cmd, int model_experts,
                                  const std::string& model_name) {
  ExpertBalanceInput in;
  in.loads = parse_expert_load(o.expert_load);
  EXPAR_CHECK(
      model_experts <= 0 || static_cast<int64_t>(in.loads.size()) == model_experts,
      "--expert-load gives {} loads, but the model {} has {} routed experts: give one load per routed "
      "expert ({} comma-separated numbers), or drop the model for a placement on its own",
      in.loads.size(), model_name, model_experts, model_experts);
  in.redundant = o.redundant_experts;
  in.ep_size = o.ep;
  if (cmd.count("--ranks-per-node") > 0) in.ranks_per_node = o.messages.ranks_per_node;
  in.expert_groups = o.expert_groups;
  return balance_experts(in);
}

// Refuses every flag given on `cmd` that is not in `allowed`: "<flag> belongs to the training plan, but
// <why>, which takes <allowed>: drop <flag> <alternative>".
void refuse_other_flags(const CLI::App& cmd, const std::vector<std::string>& allowed, const std::string& why,
                        const std::string& alternative) {
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    EXPAR_CHECK(std::find(allowed.begin(), allowed.end(), name) != allowed.end(),
                "{} belongs to the training plan, but {}, which takes {}: drop {} {}", name, why,
                fmt::join(allowed, " "), name, alternative);
  }
}

// --expert-load without a model: the placement alone.
int run_placement_only(const PlanOptions& o, const CLI::App& cmd) {
  refuse_other_flags(cmd, kPlacementOnlyFlags, "no model is given, so only the expert placement is planned",
                     "(or give --preset, --model or the shape flags for the plan with the placement)");
  const ExpertBalance balance = plan_expert_balance(o, cmd, 0, "");
  if (o.json.table_wanted()) fmt::print("{}", format_expert_balance(balance));
  if (o.json.wanted()) o.json.write(nlohmann::json{{"expert_balance", expert_balance_json(balance)}}.dump(2));
  return 0;
}

// The flags an inference plan reads; any other given with --kv-tokens is refused by name.
const std::vector<std::string> kInferencePlanFlags = {"--model",
                                                      "--tp",
                                                      "--ep",
                                                      "--placement",
                                                      "--redundant-experts",
                                                      "--kv-tokens",
                                                      "--dp",
                                                      "--enable-expert-parallel",
                                                      "--memory-limit-gib",
                                                      "--weight-dtype",
                                                      "--json"};

int run_plan_for_inference(const PlanOptions& o, const CLI::App& cmd) {
  refuse_other_flags(cmd, kInferencePlanFlags, "--kv-tokens asks for an inference plan",
                     "(or drop --kv-tokens for the training plan)");
  InferencePlanArgs a;
  a.model = o.model;
  a.kv_tokens = o.kv_tokens;
  a.options.tp = o.tp;
  a.options.dp = o.dp;
  a.options.enable_expert_parallel = o.enable_expert_parallel;
  if (cmd.count("--ep") > 0) a.options.ep_degree = o.ep;
  a.options.placement = placement_from_name(o.placement);
  a.options.redundant_experts = o.redundant_experts;
  a.options.memory_limit_bytes = std::llround(o.memory_limit_gib * 0x1p30);
  if (!o.weight_dtype.empty()) a.options.weight_dtype = infer::weight_dtype_from_name(o.weight_dtype);
  return run_inference_plan(a, o.json);
}

ModelShape build_model(const PlanOptions& o) {
  ModelShape m;
  EXPAR_CHECK(o.preset.empty() || o.model.empty(),
              "--preset {} and --model {} both name the model: pass one of them", o.preset, o.model);
  const bool named = !o.preset.empty() || !o.model.empty();
  if (!o.preset.empty()) {
    m = model_preset(o.preset);
  } else if (!o.model.empty()) {
    // The architecture as generate, eval and train read it (every config.json key honoured or refused).
    const infer::ModelSpec spec = infer::open_model_spec(o.model);
    m = model_shape(Architecture{spec.format, spec.config, spec.features}, spec.dir.filename().string());
  } else {
    m.name = "custom";
    EXPAR_CHECK(o.layers && o.d_model && o.vocab && o.heads && o.experts && o.top_k && o.expert_hidden,
                "no --preset given: give --preset (one of {}), --model (a checkpoint or its config.json) or "
                "all of --layers --d-model --vocab --heads --experts --experts-per-token --expert-hidden",
                fmt::join(model_preset_names(), ", "));
  }
  auto set = [](int& field, const std::optional<int>& v) {
    if (v) field = *v;
  };
  set(m.layers, o.layers);
  set(m.d_model, o.d_model);
  set(m.vocab, o.vocab);
  set(m.heads, o.heads);
  set(m.kv_heads, o.kv_heads);
  set(m.head_dim, o.head_dim);
  set(m.num_experts, o.experts);
  set(m.top_k, o.top_k);
  set(m.expert_hidden, o.expert_hidden);
  set(m.shared_experts, o.shared_experts);
  set(m.shared_hidden, o.shared_hidden);
  set(m.dense_layers, o.dense_layers);
  set(m.dense_hidden, o.dense_hidden);
  if (!named) {
    // Custom GQA defaults: full multi-head attention with d_model / heads per head.
    if (!o.kv_heads) m.kv_heads = m.heads;
    if (!o.head_dim && m.heads > 0) m.head_dim = m.d_model / m.heads;
    if (!o.shared_hidden) m.shared_hidden = m.expert_hidden;
  }
  return m;
}

// --precision as expar train runs it: f32 parameters, or BF16 copies of the parameters with their f32
// masters (counted with the optimizer state), and then BF16 payloads unless a leg's flag is given. The plan
// counts a BF16 copy of every parameter; the trainer makes none of the norms, the routers and an untied
// embedding (docs/plan.md), so the plan's figure is above the trainer's by those bytes.
void apply_products(PlanOptions& o, const CLI::App& cmd) {
  if (o.products.empty()) return;
  for (const char* flag : {"--param-dtype", "--no-master-weights"})
    EXPAR_CHECK(cmd.count(flag) == 0,
                "--precision {} sets the parameters' precision as expar train holds them, so {} contradicts "
                "it: drop {} (or drop --precision and give the dtypes)",
                o.products, flag, flag);
  o.param_dtype = o.products;
  if (cmd.count("--activation-dtype") == 0) o.activation_dtype = o.products;
  if (o.products == "bf16" && path_traits(o.path).reduced_precision)
    o.precision.default_unset_to(cmd, "bf16");
}

int run_plan(const PlanOptions& o, const CLI::App& cmd) {
  if (cmd.count("--kv-tokens") > 0) return run_plan_for_inference(o, cmd);
  const bool placement = cmd.count("--expert-load") > 0;
  EXPAR_CHECK(
      placement || cmd.count("--redundant-experts") + cmd.count("--expert-groups") == 0,
      "--redundant-experts and --expert-groups shape the expert placement, which --expert-load asks "
      "for: add --expert-load L0,L1,... (one load per expert), or (--redundant-experts) --kv-tokens N "
      "for the inference plan, or drop them");
  if (placement && !model_given(o)) return run_placement_only(o, cmd);
  EXPAR_CHECK(
      cmd.count("--dp") + cmd.count("--enable-expert-parallel") + cmd.count("--memory-limit-gib") +
              cmd.count("--weight-dtype") ==
          0,
      "--dp, --enable-expert-parallel, --memory-limit-gib and --weight-dtype describe inference: add "
      "--kv-tokens N (the KV positions per rank) for the inference plan, or drop them for the training "
      "plan");
  PlanConfig c;
  c.model = build_model(o);
  c.world = o.ranks;
  c.ep_mp = o.ep;
  c.cp = o.cp;
  c.tp = o.tp;
  c.pp = o.pp;
  c.placement = placement_from_name(o.placement);
  c.param_dtype = plan_dtype_from_name(o.param_dtype);
  c.grad_dtype = plan_dtype_from_name(o.grad_dtype);
  c.optimizer_dtype = plan_dtype_from_name(o.optimizer_dtype);
  c.activation_dtype = plan_dtype_from_name(o.activation_dtype);
  c.optimizer_states = o.optimizer_states;
  c.master_weights = !o.no_master_weights && c.param_dtype != DType::F32;
  c.shard_optimizer = o.shard_optimizer;
  c.tokens_per_rank = o.tokens;
  c.microbatches = o.microbatches;
  c.capacity_factor = o.capacity_factor;
  c.capacity_policy = o.capacity_policy;
  EXPAR_CHECK(std::isfinite(o.device_gib) && o.device_gib >= 0,
              "--device-gib {} must be a non-negative number of GiB (0: no fit check)", o.device_gib);
  c.device_memory_bytes = static_cast<int64_t>(o.device_gib * 0x1p30);
  PlanBufferOptions buffers;
  buffers.precision = o.precision.parse();
  buffers.recompute_moe = o.recompute_moe;
  buffers.path = o.path;
  buffers.ranks_per_node = o.messages.ranks_per_node;
  buffers.seq_len = o.seq_len;
  buffers.bf16_products = c.activation_dtype != DType::F32;
  const Plan plan = plan_training(c, buffers);
  // The message model for the stage with the most MoE layers (all stages' ranks run concurrently).
  MessageModelInputs inputs = o.messages;
  inputs.link_bytes_per_s = o.link_gbytes * 1e9;
  inputs.memory_bytes_per_s = o.memory_gbytes * 1e9;
  inputs.node_bytes_per_s = o.node_gbytes * 1e9;
  MessageModelShape shape;
  shape.tokens_per_rank = c.tokens_per_rank;
  shape.top_k = c.model.top_k;
  shape.row_bytes =
      static_cast<int64_t>(c.model.d_model) * static_cast<int64_t>(dtype_size(c.activation_dtype));
  shape.ep_mp = c.ep_mp;
  shape.microbatches = c.microbatches;
  for (const auto& stage : plan.stages) shape.moe_layers = std::max(shape.moe_layers, stage.moe_layers);
  const MessageModel messages = model_messages(shape, inputs);
  std::optional<ExpertBalance> balance;
  if (placement) balance = plan_expert_balance(o, cmd, c.model.num_experts, c.model.name);
  if (o.json.table_wanted()) {
    fmt::print("{}{}", format_plan_table(plan), format_message_model(messages));
    if (balance) fmt::print("{}", format_expert_balance(*balance));
  }
  if (o.json.wanted()) {
    nlohmann::json j = plan_to_json(plan);
    j["messages"] = message_model_json(messages);
    if (balance) j["expert_balance"] = expert_balance_json(*balance);
    o.json.write(j.dump(2));
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "plan", "Per-rank memory and per-step communication for a MoE model and an EP training layout");
  auto opts = std::make_shared<PlanOptions>();
  cmd->add_option(
      "--preset", opts->preset,
      "model from a public config.json: " + fmt::format("{}", fmt::join(model_preset_names(), ", ")));
  cmd->add_option(
      "--model", opts->model,
      "model from a checkpoint directory or its config.json (Hugging Face) / manifest.json (ours)");
  cmd->add_option("--layers", opts->layers, "transformer layers (overrides the preset)")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--d-model", opts->d_model, "hidden size")->check(integer_in(1, 1 << 30));
  cmd->add_option("--vocab", opts->vocab, "vocabulary size")->check(integer_in(1, 1 << 30));
  cmd->add_option("--heads", opts->heads, "attention heads")->check(integer_in(1, 1 << 30));
  cmd->add_option("--kv-heads", opts->kv_heads, "key/value heads (default: --heads)")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--head-dim", opts->head_dim, "head dimension (default: d_model / heads)")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--experts", opts->experts, "routed experts N")->check(integer_in(1, 1 << 30));
  add_experts_per_token_flag(cmd, opts->top_k, "routes per token K", 1 << 30);
  cmd->add_option("--expert-hidden", opts->expert_hidden, "intermediate size of one routed expert")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--shared-experts", opts->shared_experts, "shared (always active) experts per MoE layer")
      ->check(integer_in(0, 1 << 30));
  cmd->add_option("--shared-hidden", opts->shared_hidden, "intermediate size of a shared expert")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--dense-layers", opts->dense_layers, "leading layers with a dense MLP instead of MoE")
      ->check(integer_in(0, 1 << 30));
  cmd->add_option("--dense-hidden", opts->dense_hidden, "intermediate size of those dense MLPs")
      ->check(integer_in(1, 1 << 30));
  cmd->add_option("--ranks", opts->ranks, "ranks W (the world: EP x the other degrees)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  for (const char* old : {"--world", "-W"})
    retire_option(cmd, old, "--ranks", "the ranks are --ranks in every command");
  cmd->add_option("--ep", opts->ep, "EP_MP degree M_E (ranks that shard the experts)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  cmd->add_option("--cp", opts->cp, "context-parallel degree C")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  cmd->add_option("--tp", opts->tp, "tensor-parallel degree of the dense weights")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  cmd->add_option("--pp", opts->pp, "pipeline stages (a divisor of the layer count)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 24));
  cmd->add_option("--placement", opts->placement, "expert placement: " + choices(placement_names()))
      ->capture_default_str()
      ->check(one_of(placement_names()));
  cmd->add_option("--param-dtype", opts->param_dtype, "parameter precision: " + choices(plan_dtype_names()))
      ->capture_default_str();
  cmd->add_option("--grad-dtype", opts->grad_dtype, "gradient precision")->capture_default_str();
  cmd->add_option("--optimizer-dtype", opts->optimizer_dtype, "optimizer-state precision")
      ->capture_default_str();
  cmd->add_option("--activation-dtype", opts->activation_dtype, "dispatch/combine row precision")
      ->capture_default_str();
  cmd->add_option("--optimizer-states", opts->optimizer_states, "optimizer tensors per parameter (Adam: 2)")
      ->capture_default_str()
      ->check(integer_in(0, 64));
  cmd->add_flag("--no-master-weights", opts->no_master_weights,
                "no f32 master copy of the parameters (by default kept when params are not f32)");
  cmd->add_flag("--shard-optimizer", opts->shard_optimizer,
                "shard expert optimizer state over EP_DP and dense state over the D*C replicas");
  cmd->add_option("--tokens", opts->tokens, "tokens per rank per microbatch (T)")
      ->capture_default_str()
      ->check(integer_in(1, int64_t{1} << 40));
  cmd->add_option("--seq-len", opts->seq_len,
                  "tokens of one sequence, for the saved attention probabilities (default: T x C, one "
                  "sequence per rank)")
      ->check(integer_in(1, int64_t{1} << 40));
  cmd->add_option("--microbatches", opts->microbatches, "microbatches per optimizer step")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 20));
  cmd->add_option("--capacity-factor", opts->capacity_factor, "expert capacity factor (0: dropless)")
      ->capture_default_str()
      ->check(finite_in(0, 1024));
  cmd->add_option("--device-gib", opts->device_gib, "device memory per rank in GiB for a fit check (0: none)")
      ->check(finite_in(0, 1e9));
  cmd->add_option(
         "--capacity-policy", opts->capacity_policy,
         "capacity rule with a capacity factor (as expar train): " + choices(capacity_policy_names()))
      ->capture_default_str()
      ->check(one_of(capacity_policy_names()));
  cmd->add_flag("--recompute-moe", opts->recompute_moe,
                "every MoE block recomputed in backward (as expar train): no per-block dispatch lease");
  const std::vector<std::string> leasing_paths = path_names_with(&PathTraits::shared_heap);
  cmd->add_option(
         "--path", opts->path,
         "execution path whose symmetric buffers are sized (as expar train): " + choices(leasing_paths) +
             " (aggregated adds one pack buffer per MoE layer; across nodes, see --ranks-per-node)")
      ->capture_default_str()
      ->check(one_of(leasing_paths));
  add_precision_flags(cmd, opts->precision);
  cmd->add_option("--precision", opts->products,
                  "the products' precision as expar train runs them: f32 (f32 parameters) | bf16 (BF16 "
                  "copies of f32 masters; the payload and activation flags then default to bf16); sets "
                  "--param-dtype")
      ->check(one_of({"f32", "bf16"}));
  cmd->add_option(
         "--ranks-per-node", opts->messages.ranks_per_node,
         "ranks per node for the message model, aggregated's pack buffers and, when given, the expert "
         "placement's node-first packing (EP groups fill whole nodes)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 20));
  cmd->add_option("--link-gbytes-per-s", opts->link_gbytes,
                  "network bandwidth per rank, GB/s (message model)")
      ->capture_default_str()
      ->check(finite_above(0, 1e9));
  cmd->add_option("--nic-messages-per-s", opts->messages.nic_messages_per_s,
                  "messages per second one rank's NIC issues (message model)")
      ->capture_default_str()
      ->check(finite_above(0, 1e15));
  cmd->add_option("--memory-gbytes-per-s", opts->memory_gbytes,
                  "local copy bandwidth per rank, GB/s: pack, unpack, forward (message model)")
      ->capture_default_str()
      ->check(finite_above(0, 1e9));
  cmd->add_option("--node-gbytes-per-s", opts->node_gbytes,
                  "rank-to-rank bandwidth inside a node, GB/s (message model)")
      ->capture_default_str()
      ->check(finite_above(0, 1e9));
  cmd->add_option("--kv-tokens", opts->kv_tokens,
                  "inference plan: KV-cache positions per rank (with --model DIR, --tp, --dp, "
                  "--enable-expert-parallel, --ep, --placement, --memory-limit-gib)")
      ->check(integer_in(0, int64_t{1} << 40));
  cmd->add_option("--dp", opts->dp, "inference plan: data-parallel replicas")->check(integer_in(1, 256));
  cmd->add_flag("--enable-expert-parallel", opts->enable_expert_parallel,
                "inference plan: whole experts on ranks (as generate and serve)");
  cmd->add_option("--memory-limit-gib", opts->memory_limit_gib,
                  "inference plan: memory the process may hold (0: what the machine has available)")
      ->check(finite_in(0, 1 << 24));
  cmd->add_option("--weight-dtype", opts->weight_dtype,
                  "inference plan: the F32 weights the products multiply converted at load to " +
                      choices(infer::weight_dtype_names()))
      ->check(one_of(infer::weight_dtype_names()));
  cmd->add_option("--expert-load", opts->expert_load,
                  "expert placement: the load of each routed expert in one MoE layer (e.g. tokens over a "
                  "window), comma-separated; shows the redundant-expert placement of DeepSeek's EPLB over "
                  "--ep ranks for that layer (each MoE layer is placed by its own loads; without a model: "
                  "the placement alone)");
  cmd->add_option("--redundant-experts", opts->redundant_experts,
                  "expert placement, or the inference plan with --enable-expert-parallel: R extra expert "
                  "slots (S = experts + R, a multiple of --ep) holding replicas")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 20));
  cmd->add_option("--expert-groups", opts->expert_groups,
                  "expert placement: G groups of consecutive experts packed whole onto nodes with "
                  "--ranks-per-node (DeepSeek-V3: 8; 0: one group per expert)")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 24));
  add_json_option(cmd, opts->json, "the plan");
  table[cmd] = [opts, cmd] {
    apply_products(*opts, *cmd);
    return run_plan(*opts, *cmd);
  };
}

}  // namespace expar::cli
