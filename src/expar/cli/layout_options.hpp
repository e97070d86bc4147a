#pragma once
// The inference layout flags (--tp, --dp, --enable-expert-parallel, --ep, --placement,
// --redundant-experts, --decode-moe, --threads, --oversubscribe, --memory-limit-gib, --weight-dtype,
// --precision), defined once for `expar generate`, `expar eval`, `expar bench generate`, `expar serve` and
// `expar bench serve`.
#include <CLI/CLI.hpp>
#include <string>

#include "expar/infer/generate.hpp"

namespace expar::cli {

struct LayoutArgs {
  int tp = 1, dp = 1;
  // EP is opt-in, as seed 002 and vLLM have it: without --enable-expert-parallel the MoE layers shard every
  // expert on the intermediate dimension over TP (at batch 1 on 2 cores also the faster decode).
  bool enable_expert_parallel = false;
  int ep = 0;  // 0: unset (TP*DP with EP, 1 without); > 1 needs enable_expert_parallel
  std::string placement = "contiguous";
  int redundant_experts = 0;             // R extra expert slots over the EP group (issue #36); needs EP
  std::string decode_moe = "allreduce";  // allreduce | rowwise
  int threads = 0;                       // compute threads per rank; 0: cores / ranks
  bool oversubscribe = false;
  double memory_limit_gib = 0;    // 0: what the machine has available
  std::string weight_dtype;       // empty: as stored
  std::string precision = "f32";  // the products' operands: f32 | bf16 (core/product_precision.hpp)
};

// with_decode_moe: also --decode-moe (commands that decode).
void add_layout_options(CLI::App* cmd, LayoutArgs& a, bool with_decode_moe);
// The engine options of the flags; throws expar::Error when ranks x threads exceed the cores without
// --oversubscribe (threads_per_rank), and --precision bf16 on a CPU without BF16 dot products. --ep is passed
// through as set, so the layout's own rule refuses
// --ep N > 1 without --enable-expert-parallel.
infer::GenerateOptions engine_options(const LayoutArgs& a);
// "off" without expert parallelism; with it "1 (each DP replica holds every expert[, sharded over TP])",
// "N (full)", "N (variable: EP+TP)", "N (full inside each DP replica)" or "N (partial cross-DP: EP groups of
// g DP replicas)" for the one-line summaries, from the EP degree of the layout that ran
// (GenerateResult::ep_degree and the like), not from the flags (whose --ep may be unset).
std::string ep_label(bool expert_parallel, int ep_degree, int tp, int dp);

}  // namespace expar::cli
