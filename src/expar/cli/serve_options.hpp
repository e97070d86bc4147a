#pragma once
// The flags of the serving runtime (model, layout, threads, batch invariance, KV cache, scheduler), defined
// once for `expar serve` and `expar bench serve`.
#include <CLI/CLI.hpp>
#include <string>

#include "expar/serve/runtime.hpp"

namespace expar::cli {

struct RuntimeArgs {
  std::string path, format = "auto", placement = "contiguous", decode_moe = "allreduce";
  int tp = 1, dp = 1, ep = 0;
  int threads = 0;  // compute threads per rank; 0: cores / ranks
  bool no_ep = false, oversubscribe = false, no_batch_invariant = false;
  int64_t kv_cache_mb = 256;
  serve::SchedulerOptions scheduler;
};

void add_runtime_options(CLI::App* cmd, RuntimeArgs& a);
// Checks the flags (ranks x threads within the cores unless --oversubscribe) and builds the options.
serve::RuntimeOptions runtime_options(const RuntimeArgs& a);

}  // namespace expar::cli
