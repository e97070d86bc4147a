#include "expar/cli/serve_options.hpp"

#include "expar/core/error.hpp"

namespace expar::cli {

void add_runtime_options(CLI::App* cmd, RuntimeArgs& a) {
  add_checkpoint_options(cmd, a.checkpoint);
  add_layout_options(cmd, a.layout, true);
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
  cmd->add_option("--eplb-window", a.eplb.window,
                  "Engine steps whose expert loads a rebalance (and /metrics' imbalance) is computed from")
      ->capture_default_str();
  cmd->add_option("--eplb-interval", a.eplb.interval,
                  "Engine steps between rebalances of the experts over the EP ranks (DeepSeek's EPLB policy, "
                  "weights moved between steps; 0: never; needs --enable-expert-parallel)")
      ->capture_default_str();
}

serve::RuntimeOptions runtime_options(const RuntimeArgs& a) {
  EXPAR_CHECK(!a.checkpoint.dir.empty(), "a model is needed: pass --checkpoint <dir or file>");
  serve::RuntimeOptions o;
  o.path = a.checkpoint.dir;
  o.model = engine_options(a.layout);
  o.model.format = a.checkpoint.model_format();
  o.batch_invariant = !a.no_batch_invariant;
  o.kv_cache_mb = a.kv_cache_mb;
  o.scheduler = a.scheduler;
  o.eplb = a.eplb;
  return o;
}

}  // namespace expar::cli
