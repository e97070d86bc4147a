#pragma once
// The MoE layer's shape flags, one spelling per quantity across subcommands (as `expar plan`): --d-model,
// --expert-hidden, --experts, --top-k. The benchmarks' old spellings --d / --dim and --h stay accepted for
// one release, listed under kOldSpellings in --help.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace expar::cli {

inline constexpr const char* kOldSpellings = "Old spellings (accepted for one release)";

// `d_help` / `h_help` describe the two dimensions for this subcommand (e.g. "a multiple of 32 for MXFP8").
void add_layer_shape_flags(CLI::App* cmd, int64_t& model_dim, int64_t& hidden_dim, int& experts, int& top_k,
                           const std::string& d_help = "model dimension d",
                           const std::string& h_help = "expert hidden (intermediate) dimension h");

}  // namespace expar::cli
