#pragma once
// The inference layout flags (--tp, --dp, --ep, --no-ep, --placement, --decode-moe, --threads,
// --oversubscribe), defined once for `expar generate`, `expar eval` and `expar bench generate`.
#include <CLI/CLI.hpp>
#include <string>

#include "expar/infer/generate.hpp"

namespace expar::cli {

struct LayoutArgs {
  int tp = 1, dp = 1;
  int ep = 0;  // 0: TP*DP (full EP)
  bool no_ep = false;
  std::string placement = "contiguous";
  std::string decode_moe = "allreduce";  // allreduce | rowwise
  int threads = 0;                       // compute threads per rank; 0: cores / ranks
  bool oversubscribe = false;
};

// with_decode_moe: also --decode-moe (commands that decode).
void add_layout_options(CLI::App* cmd, LayoutArgs& a, bool with_decode_moe);
// The engine options of the flags; throws expar::Error when ranks x threads exceed the cores without
// --oversubscribe (threads_per_rank).
infer::GenerateOptions engine_options(const LayoutArgs& a);
// "TP*DP", "off" or the degree, for the one-line summaries.
std::string ep_label(const LayoutArgs& a);

}  // namespace expar::cli
