#pragma once
// The flags of the serving runtime (model, layout, threads, batch invariance, KV cache, scheduler), defined
// once for `expar serve` and `expar bench serve`; the layout flags are generate's (layout_options.hpp).
#include <CLI/CLI.hpp>
#include <string>

#include "expar/cli/checkpoint_flags.hpp"
#include "expar/cli/layout_options.hpp"
#include "expar/serve/runtime.hpp"

namespace expar::cli {

struct RuntimeArgs {
  CheckpointArgs checkpoint;  // --checkpoint, --format
  LayoutArgs layout;
  bool no_batch_invariant = false;
  int64_t kv_cache_mb = 256;
  serve::SchedulerOptions scheduler;
  serve::EplbOptions eplb;  // --eplb-window, --eplb-interval
};

void add_runtime_options(CLI::App* cmd, RuntimeArgs& a);
// Checks the flags (ranks x threads within the cores unless --oversubscribe) and builds the options.
serve::RuntimeOptions runtime_options(const RuntimeArgs& a);

}  // namespace expar::cli
