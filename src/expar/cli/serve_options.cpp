#include "expar/cli/serve_options.hpp"

#include "expar/cli/option_checks.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/placement.hpp"

namespace expar::cli {

void add_runtime_options(CLI::App* cmd, RuntimeArgs& a) {
  cmd->add_option("--path", a.path, "Checkpoint directory or a file in one")->required();
  cmd->add_option("--format", a.format, "Checkpoint format: auto | ours | mixtral | qwen-moe | gpt-oss")
      ->capture_default_str();
  cmd->add_option("--tp", a.tp, "Tensor-parallel degree (ranks per DP replica)")->capture_default_str();
  cmd->add_option("--dp", a.dp, "Data-parallel replicas (each schedules its own requests)")
      ->capture_default_str();
  cmd->add_option("--ep", a.ep, "EP degree (0: TP*DP; < TP: variable EP+TP)")->capture_default_str();
  cmd->add_flag("--no-ep", a.no_ep, "Shard experts on the intermediate dimension over TP instead of EP");
  cmd->add_option("--placement", a.placement, "Expert placement: contiguous | round-robin")
      ->capture_default_str();
  cmd->add_option("--decode-moe", a.decode_moe, "Decode MoE pattern: allreduce | rowwise (full EP only)")
      ->capture_default_str();
  cmd->add_option("--threads", a.threads, "Compute threads per rank (0: cores / ranks)")
      ->capture_default_str();
  cmd->add_flag("--oversubscribe", a.oversubscribe, "Allow ranks x threads above the cores");
  cmd->add_flag(
      "--no-batch-invariant", a.no_batch_invariant,
      "Let small batches use faster kernels (a request's tokens may then depend on its neighbours)");
  cmd->add_option("--kv-cache-mb", a.kv_cache_mb, "KV-cache budget per rank (MiB)")->capture_default_str();
  cmd->add_option("--max-batch-tokens", a.scheduler.max_batch_tokens, "Tokens per replica per step")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a.scheduler.prefill_chunk, "Prompts run in chunks of this many tokens")
      ->capture_default_str();
  cmd->add_option("--max-running", a.scheduler.max_running, "Sequences per replica in the running batch")
      ->capture_default_str();
  cmd->add_option("--max-waiting", a.scheduler.max_waiting, "Queued requests before 503")
      ->capture_default_str();
}

serve::RuntimeOptions runtime_options(const RuntimeArgs& a) {
  EXPAR_CHECK(!a.path.empty(), "a model is needed: pass --path <checkpoint dir or file>");
  EXPAR_CHECK(a.tp >= 1 && a.tp <= 1024 && a.dp >= 1 && a.dp <= 1024,
              "--tp {} and --dp {} must be in [1, 1024]", a.tp, a.dp);
  const int threads = threads_per_rank(a.threads, a.tp * a.dp, a.oversubscribe);
  serve::RuntimeOptions o;
  o.path = a.path;
  o.model.tp = a.tp;
  o.model.dp = a.dp;
  o.model.enable_expert_parallel = !a.no_ep;
  if (a.ep > 0) o.model.ep_degree = a.ep;
  o.model.placement = placement_from_name(a.placement);
  if (a.format != "auto") o.model.format = infer::model_format_from_name(a.format);
  o.model.decode_moe = infer::decode_moe_from_name(a.decode_moe);
  o.model.compute_threads = threads;
  o.batch_invariant = !a.no_batch_invariant;
  o.kv_cache_mb = a.kv_cache_mb;
  o.scheduler = a.scheduler;
  return o;
}

}  // namespace expar::cli
