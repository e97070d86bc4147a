// `expar generate`: text from a checkpoint (ours, or Hugging Face Mixtral, Qwen-MoE, gpt-oss).
//  - greedy (the default): the inference engine of seed 002 (infer/): TP x DP ranks as threads, attention
//    heads split over TP, experts sharded on the intermediate dimension over TP or, with
//    --enable-expert-parallel, over the EP group (full, variable ep_degree < TP, or cross-DP), a KV cache,
//    prefill all-gather -> experts -> reduce-scatter and decode all-reduce (or, with --decode-moe rowwise and
//    full EP, the rowwise path: rows to their experts' owners and back); prints prefill/decode tokens/s.
//    --checkpoint is a checkpoint directory or a file in one; --format says which layout it is (auto:
//    detected from manifest.json / config.json's model_type). When the checkpoint directory has a
//    tokenizer.json, --prompt is encoded by it (--chat: as one user message through its chat template) and
//    the output is decoded text; otherwise the prompt is --prompt-ids (or the prompt's bytes) and the output
//    ids.
//  - --temperature > 0: sampling (temperature, top-k) with the training model over TP*DP ranks with the EP
//    degree greedy decoding would use; each new byte reruns the forward over the window (no KV cache on this
//    path; ours only).
#include "expar/infer/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "expar/cli/checkpoint_flags.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/layout_options.hpp"
#include "expar/cli/load_report.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/tokenize.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/timer.hpp"
#include "expar/infer/sampling.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/topo/training_layout.hpp"
#include "expar/train/checkpoint.hpp"

namespace expar::cli {

namespace {

struct GenerateArgs {
  CheckpointArgs checkpoint;  // --checkpoint, --format
  std::string prompt = "In the beginning";
  std::vector<int32_t> prompt_ids;  // overrides the prompt's bytes (Hugging Face vocabularies)
  bool chat = false;                // --prompt as a user message through the tokenizer's chat template
  int tokens = 100;
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: all
  uint64_t seed = 7;
  LayoutArgs layout;
  std::string expert_path = "rowwise";
};

// The checkpoint of --checkpoint (open_model_spec follows `latest`).
const std::string& checkpoint_of(const GenerateArgs& a) {
  return a.checkpoint.dir;
}

std::optional<infer::ModelFormat> format_of(const GenerateArgs& a) {
  return a.checkpoint.model_format();
}

int run_engine(const GenerateArgs& a) {
  // The engine's KV cache holds the prompt and every generated token: refuse a run that cannot fit before
  // starting any rank.
  const infer::ModelSpec spec = infer::open_model_spec(checkpoint_of(a), format_of(a));
  const int64_t prompt_tokens =
      static_cast<int64_t>(a.prompt_ids.empty() ? a.prompt.size() : a.prompt_ids.size());
  const int64_t max_seq = spec.config.max_seq;
  EXPAR_CHECK(prompt_tokens + a.tokens <= max_seq,
              "the prompt ({} tokens) and --tokens {} need {} positions but the model's max_seq is {}: pass "
              "--tokens {} or less, or sample with --temperature > 0 (it slides the context window)",
              prompt_tokens, a.tokens, prompt_tokens + a.tokens, max_seq,
              std::max<int64_t>(0, max_seq - prompt_tokens));
  infer::GenerateOptions o = engine_options(a.layout);
  if (const auto format = format_of(a)) o.format = *format;
  std::vector<int32_t> prompt = a.prompt_ids;
  std::optional<TextPrompt> tokenized;  // the checkpoint's own tokenizer: text in, text out
  if (prompt.empty()) tokenized = encode_prompt(spec, a.prompt, a.chat);
  if (tokenized) prompt = tokenized->ids;
  if (prompt.empty())
    for (unsigned char c : a.prompt) prompt.push_back(c);
  const LoadReport report("expar generate", spec, o, static_cast<int64_t>(prompt.size()) + a.tokens);
  infer::GenerateResult r = infer::generate(o, checkpoint_of(a), prompt, a.tokens);
  if (tokenized) {
    fmt::print("{}\n", decode_generated(*tokenized, r.tokens));
  } else if (r.format == infer::ModelFormat::Expar && a.prompt_ids.empty()) {
    std::string text = a.prompt;  // our byte-level model: tokens are bytes
    for (int32_t t : r.tokens) text.push_back(static_cast<char>(t));
    fmt::print("{}\n", text);
  } else {
    std::string ids;  // no tokenizer here: print the token ids
    for (int32_t t : r.tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
    fmt::print("{}\n", ids);
  }
  fmt::print(stderr,
             "[{}, TP {} x DP {}, EP {}, {} thread(s) per rank, products {}: prefill {:.1f} tokens/s, decode "
             "({}) {:.1f} tokens/s]\n",
             infer::model_format_name(r.format), a.layout.tp, a.layout.dp,
             ep_label(a.layout.enable_expert_parallel, r.ep_degree, a.layout.tp, a.layout.dp),
             o.compute_threads, a.layout.precision, r.prefill_tokens_per_s, a.layout.decode_moe,
             r.decode_tokens_per_s);
  for (size_t rank = 0; rank < r.memory.size(); ++rank)
    fmt::print(stderr, "rank {} memory (current at the end, peak):\n{}", rank, format_memory(r.memory[rank]));
  fmt::print(stderr, "peak resident set of the process: {}\n", format_bytes(r.peak_rss_bytes));
  return 0;
}

int run_generate(const GenerateArgs& a) {
  if (a.temperature <= 0.0) return run_engine(a);
  const infer::ModelSpec spec = infer::open_model_spec(checkpoint_of(a), format_of(a));
  EXPAR_CHECK(
      spec.format == infer::ModelFormat::Expar,
      "--temperature {} samples with the training model, which reads our checkpoints only, not {}: drop "
      "--temperature for greedy decoding on the inference engine",
      a.temperature, infer::model_format_name(spec.format));
  const std::string checkpoint = spec.dir.string();
  CheckpointInfo info = read_checkpoint_info(checkpoint);
  const ModelConfig config = info.model;
  const LayoutArgs& lay = a.layout;
  // The EP degree by the inference layout's rules (seed 002), so --ep means the same as for greedy decoding.
  const int ranks = lay.tp * lay.dp, ep = infer::inference_layout(engine_options(lay), config).ep_degree();
  ModelExecution execution;
  execution.moe.path = ep == 1 ? "local" : a.expert_path;
  execution.moe.placement = placement_from_name(lay.placement);
  EXPAR_CHECK(
      lay.decode_moe == "allreduce",
      "--decode-moe {} applies to greedy decoding on the inference engine; sampling (--temperature {}) "
      "runs the training model: drop --decode-moe",
      lay.decode_moe, a.temperature);
  EXPAR_CHECK(
      lay.precision == "f32",
      "--precision {} applies to greedy decoding on the inference engine; sampling (--temperature {}) "
      "runs the training model's f32 products: drop --precision",
      lay.precision, a.temperature);
  EXPAR_CHECK(lay.redundant_experts == 0,
              "--redundant-experts {} applies to greedy decoding on the inference engine; sampling "
              "(--temperature {}) runs the training model, which holds one slot per expert: drop "
              "--redundant-experts",
              lay.redundant_experts, a.temperature);
  // infer/'s sampler, the one expar serve draws with: the token at step i is a pure function of the logits,
  // the parameters, --seed and i.
  infer::SamplingParams sampling;
  sampling.temperature = a.temperature;
  sampling.top_k = a.top_k;
  infer::validate(sampling);
  std::vector<int32_t> prompt = a.prompt_ids;
  if (prompt.empty())
    for (unsigned char c : a.prompt) prompt.push_back(c);
  for (int32_t id : prompt)
    EXPAR_CHECK(id >= 0 && id < config.vocab,
                "--prompt-ids holds {}, outside the model's vocabulary [0, {}): our model's tokens are bytes",
                id, config.vocab);
  EXPAR_CHECK(!prompt.empty(), "the prompt is empty: pass --prompt TEXT or --prompt-ids");
  // Each byte is printed as it is sampled (rank 0), so the text streams.
  if (a.prompt_ids.empty()) {
    fmt::print("{}", a.prompt);
  } else {
    for (int32_t id : prompt) fmt::print("{}", static_cast<char>(id));
  }
  std::fflush(stdout);
  double seconds = 0;
  LaunchOptions launch;
  launch.ranks = ranks;
  launch.compute_threads = threads_per_rank(lay.threads, ranks, lay.oversubscribe);
  run_ranks(launch, [&](Comm& world) {
    TrainingLayout layout(world.size(), ep);
    auto ep_mp = world.subgroup(layout.groups(TrainingGroup::EpMp), "ep_mp");
    MoeTransformer model(config, execution, *ep_mp);
    load_checkpoint(checkpoint, model, nullptr);
    std::vector<int32_t> ids = prompt;
    Timer timer;
    for (int i = 0; i < a.tokens; ++i) {
      const auto window =
          static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(config.max_seq)));
      std::vector<int32_t> ctx(ids.end() - window, ids.end());
      Tensor logits = model.logits(ctx, 1, window);
      int32_t next = infer::sample_token(logits.data<float>() + (window - 1) * config.vocab, config.vocab,
                                         sampling, a.seed, static_cast<uint64_t>(i));
      world.broadcast(&next, 1, DType::I32, 0);  // every rank continues with rank 0's choice
      ids.push_back(next);
      if (world.rank() == 0) {
        fmt::print("{}", static_cast<char>(next));
        std::fflush(stdout);
      }
    }
    if (world.rank() == 0) seconds = timer.seconds();
  });
  fmt::print("\n");
  fmt::print(stderr, "[sampled {} bytes in {:.2f} s, {:.1f} bytes/s, {} rank(s), EP {}]\n", a.tokens, seconds,
             a.tokens / std::max(seconds, 1e-9), ranks, ep);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a trained checkpoint");
  auto a = std::make_shared<GenerateArgs>();
  add_checkpoint_options(cmd, a->checkpoint);
  cmd->add_option("--prompt", a->prompt)->capture_default_str();
  cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as token ids (instead of the prompt's bytes)")
      ->delimiter(',');
  cmd->add_flag("--chat", a->chat, "Send --prompt as a user message through the checkpoint's chat template");
  cmd->add_option("--tokens", a->tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(integer_in(0, 1'000'000));
  cmd->add_option("--temperature", a->temperature, "0: greedy on the inference engine; > 0: sampling")
      ->capture_default_str()
      ->check(finite_in(0, 1000));
  cmd->add_option("--top-k", a->top_k, "Sample among the k most likely bytes (0: all)")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 24));
  cmd->add_option("--seed", a->seed)->capture_default_str();
  add_layout_options(cmd, a->layout, true);
  cmd->add_option("--expert-path", a->expert_path,
                  "Execution path of the sampling mode (--temperature > 0): " + choices(path_names()))
      ->capture_default_str();
  table[cmd] = [a] { return run_generate(*a); };
}

}  // namespace expar::cli
