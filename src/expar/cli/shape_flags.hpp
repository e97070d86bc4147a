#pragma once
// The MoE layer's shape flags, one spelling per quantity across subcommands (as `expar plan`): --d-model,
// --expert-hidden, --experts, --experts-per-token (routes per token K, as config.json's
// num_experts_per_tok; --top-k is sampling's, in expar generate). Old spellings (--d, --dim, --h, --top-k)
// are refused with the new one (retire_option). add_layer_bench_flags binds the whole
// bench::LayerBenchSetup of the layer benchmarks (paths, payload, waves, bar, scaling).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "expar/bench/layer_bench.hpp"
#include "expar/cli/option_checks.hpp"

namespace expar::cli {

// --experts-per-token in [1, max] with `help`, and --top-k refused with it: every subcommand that takes
// routes per token (layer, plan, the layer benchmarks). `top_k` is an int or an std::optional<int>.
template <typename T>
CLI::Option* add_experts_per_token_flag(CLI::App* cmd, T& top_k, const std::string& help, int64_t max);
void retire_top_k(CLI::App* cmd);

template <typename T>
CLI::Option* add_experts_per_token_flag(CLI::App* cmd, T& top_k, const std::string& help, int64_t max) {
  CLI::Option* option = cmd->add_option("--experts-per-token", top_k, help)->check(integer_in(1, max));
  retire_top_k(cmd);
  return option;
}
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
