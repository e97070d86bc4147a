#pragma once
// expar bench serve: the serving runtime (scheduler + rank threads + engine, as `expar serve` runs them,
// without the HTTP layer) under closed-loop load — C clients, each submitting its next request when the
// previous one ends — at several concurrencies, beside the single-request decode rate measured in the same
// run. Random prompts of a fixed length, greedy, a fixed number of generated tokens each.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/serve/runtime.hpp"

namespace expar::bench {

struct ServeBenchOptions {
  serve::RuntimeOptions runtime;
  std::vector<int> concurrency = {1, 4, 16, 64};
  int requests_per_client = 2;  // requests each client runs per level (at least 8 per level in all)
  int64_t prompt_tokens = 32, generated_tokens = 32;
  uint64_t seed = 1;
};

struct ServeLevel {
  int concurrency = 0;
  int64_t requests = 0, output_tokens = 0;
  double seconds = 0.0, requests_per_s = 0.0, output_tokens_per_s = 0.0;
  double ttft_p50 = 0.0, ttft_p99 = 0.0, tpot_p50 = 0.0, tpot_p99 = 0.0;  // seconds
  double speedup = 0.0;  // output tokens/s over the single-request decode tokens/s
};

struct ServeBenchResult {
  double single_request_decode_tokens_per_s = 0.0;  // one request alone: 1 / median time per output token
  std::vector<ServeLevel> levels;
};

ServeBenchResult run_serve_bench(const ServeBenchOptions& options);

}  // namespace expar::bench
