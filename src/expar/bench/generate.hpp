#pragma once
// expar bench generate: prefill and decode tokens/s of the inference engine at a given prompt length,
// generation length and layout, each beside the limit measured in the same run on the same ranks:
//  - prefill: the time this rank's matrix products of the prompt take alone in oneDNN sgemm at their own
//    shapes (q/k/v/o with the local heads, the router, each local expert slot at its mean rows P·K/S,
//    attention scores at the q projection's rate, the last row's LM head slice), all ranks at once, the
//    heads' and the experts' products spread over the compute threads as the engine spreads them
//    (core/parallel_tasks);
//  - decode: streaming read bandwidth (every rank reading its own buffer with its compute threads, all at
//    once) divided into the bytes a decode step must read per rank: its dense weights, its expected share
//    of the K active experts (K·S_L/S local slots at batch 1; S = E without replicas), its LM head slice and
//    its KV cache; beside it the "routed" limit, with the experts each step's routes actually put on the
//    busiest rank (EP at batch 1 often puts both of top-2 on one rank: that rank's bytes bound the step).
// Fractions are ideal time / measured time (1 = at the limit). Medians over repeats of the slowest rank.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/infer/generate.hpp"

namespace expar::bench {

struct GenerateBenchOptions {
  std::string path;
  infer::GenerateOptions engine;  // layout, format, threads, decode_moe
  int64_t prompt_tokens = 512;
  int tokens = 32;  // generated tokens: one from the prefill, tokens - 1 decode steps
  int warmup = 1;
  int repeats = 3;
  uint64_t seed = 1;
  // --router-skew s: a Zipf-like bias on every MoE router's logits (moe/router_skew.hpp, from s, E and
  // `seed`), added in memory: the checkpoint is unchanged. 0: the checkpoint's routing.
  double router_skew = 0;
  // --eplb-prompts N: with redundant experts, the untimed runs on N other prompts of the same length whose
  // loads, summed per MoE layer, choose each layer's placement (a server's --eplb-window, in prompts).
  int eplb_prompts = 4;
};

struct GenerateBenchReport {
  int ranks = 1, threads = 1;
  int ep_degree = 1;                                             // the layout's (1: no EP)
  double prefill_seconds = 0.0, decode_seconds_per_token = 0.0;  // medians, slowest rank
  double prefill_tokens_per_s = 0.0, decode_tokens_per_s = 0.0;  // per DP replica
  double prefill_limit_seconds = 0.0;   // the prompt's matrix products alone (max over ranks)
  double prefill_flops = 0.0;           // the prompt's matrix-product FLOPs on the busiest rank
  double matmul_flops = 0.0;            // prefill_flops / prefill_limit_seconds: sgemm FLOP/s at these shapes
  double read_bandwidth = 0.0;          // bytes/s per rank, all ranks reading at once
  double decode_bytes_per_token = 0.0;  // max over ranks of the bytes a decode step reads (expected share)
  // The same for the routes the last run took: per step the busiest rank's dense bytes plus the experts it
  // ran, averaged over the steps (above the expected share where the K experts meet on one rank).
  double decode_routed_bytes_per_token = 0.0;
  double prefill_matmul_fraction = 0.0, decode_bandwidth_fraction = 0.0;
  double decode_routed_fraction = 0.0;  // against read_bandwidth / decode_routed_bytes_per_token
  // Per rank, after the timed runs (before the limits): current = what the engine holds (its weights),
  // peak = the high-water mark of loading and the runs (KV cache included).
  std::vector<MemorySnapshot> memory;
  int64_t weight_bytes = 0;    // weight bytes held, summed over ranks (TP 1: the model's)
  int64_t peak_rss_bytes = 0;  // this process's peak resident set after the runs, before the limits
  // The KV cache of one position on rank 0 (every layer); with latent attention, the latent rows, and what
  // the expanded keys and values of its heads would take instead (0 otherwise).
  int64_t kv_bytes_per_token = 0, kv_bytes_per_token_expanded = 0;
  // The experts' load per rank in the last timed run: per MoE layer, (max - mean) / mean over the ranks of
  // the token rows their experts computed, then the mean over the layers (and the largest layer's).
  double prefill_imbalance = 0.0, prefill_imbalance_max = 0.0;
  double decode_imbalance = 0.0, decode_imbalance_max = 0.0;
  // With redundant experts: the placements EPLB chose, each MoE layer's from its loads of untimed runs on
  // eplb_prompts other prompts (serve's rebalancer and the engine's move), how many layers' placements
  // changed, and what moving to them cost: weight bytes received, all ranks, and the slowest rank's seconds.
  // 0 when no placement changed or without replicas.
  bool rebalanced = false;
  int moved_layers = 0;
  int64_t moved_bytes = 0;
  double move_seconds = 0.0;
};

// Throws expar::Error for a bad option (the message names it) or a prompt + generation above max_seq.
GenerateBenchReport run_generate_bench(const GenerateBenchOptions& options);

std::string generate_bench_json(const GenerateBenchOptions& options, const GenerateBenchReport& report);

}  // namespace expar::bench
