#pragma once
// What every MoE-layer benchmark (bench paths, payload, waves, bar, scaling) runs at: the layer's shape and
// the launch. One struct, bound to its flags once (cli/shape_flags.hpp) and copied whole when one benchmark
// runs another (bench payload runs bench paths once per format).
#include <cstdint>
#include <nlohmann/json.hpp>

namespace expar::bench {

struct LayerBenchSetup {
  int ranks = 2;
  int threads = 1;        // compute threads per rank
  int64_t tokens = 4096;  // per rank
  int64_t model_dim = 1024;
  int64_t hidden_dim = 2048;
  int experts = 32;
  int top_k = 4;
  int warmup = 1;
  int repeats = 3;
  uint64_t seed = 1;
  bool oversubscribe = false;
};

// Throws expar::Error naming the flag for a size below 1, top-k outside [1, experts] or no repeats. (Each
// benchmark checks the cores last, with measure.hpp's check_cores, after its own rules.)
void validate_setup(const LayerBenchSetup& s);

// The setup as the "options" of a report's JSON: ranks, threads, tokens_per_rank, d, h, experts, top_k,
// repeats, warmup, seed (each benchmark adds its own keys).
nlohmann::json setup_json(const LayerBenchSetup& s);

}  // namespace expar::bench
