#pragma once
// The MoE layer's shape flags, one spelling per quantity across subcommands (as `expar plan`): --d-model,
// --expert-hidden, --experts, --top-k. The benchmarks' old spellings --d / --dim and --h stay accepted for
// one release, listed under kOldSpellings in --help. add_layer_bench_flags binds the whole
// bench::LayerBenchSetup of the layer benchmarks (paths, payload, waves, bar, scaling).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "expar/bench/layer_bench.hpp"

namespace expar::cli {

inline constexpr const char* kOldSpellings = "Old spellings (accepted for one release)";

// `d_help` / `h_help` describe the two dimensions for this subcommand (e.g. "a multiple of 32 for MXFP8").
void add_layer_shape_flags(CLI::App* cmd, int64_t& model_dim, int64_t& hidden_dim, int& experts, int& top_k,
                           const std::string& d_help = "model dimension d",
                           const std::string& h_help = "expert hidden (intermediate) dimension h");

// What a subcommand says of its flags in --help; an empty `ranks` / `threads` leaves that flag out (bench bar
// runs fixed launches).
struct LayerBenchHelp {
  std::string ranks = "ranks (threads of this process)";
  std::string threads = "compute (oneDNN) threads per rank";
  std::string tokens = "tokens per rank";
  std::string d = "model dimension d";
  std::string h = "expert hidden (intermediate) dimension h";
};

// --ranks, --threads, --tokens, the shape flags, --repeats, --warmup, --seed and --oversubscribe.
void add_layer_bench_flags(CLI::App* cmd, bench::LayerBenchSetup& s, const LayerBenchHelp& help = {});

}  // namespace expar::cli
