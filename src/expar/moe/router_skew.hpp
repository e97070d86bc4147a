#pragma once
// A skewed routing load for the benchmarks of redundant experts (issue #36): a bias added to the router's
// logits that makes the experts' popularity Zipf-like, as measured on real MoE models (exponent s ≈ 1).
//
// Each of the E experts gets a popularity rank r_e in 1..E, a permutation drawn from (`seed`, layer) (not
// the expert order: the contiguous placement would otherwise put all the hottest experts on the first rank,
// a worst case rather than a typical one; and another one in every MoE layer, since real models' hot
// experts differ from layer to layer, which is why each layer gets its own placement), and the logit bias
// b_e = −s · ln(r_e). For equal raw logits every
// expert's softmax weight is then r_e^−s times the hottest one's: popularity ∝ 1/r_e^s. What top-K
// selection picks also depends on the router's own logits, so the benchmarks report the loads it gave.
// Selection is monotone in the logit, so the same bias skews softmax and sigmoid routers alike.
//
// A pure function of (s, E, seed, layer): every rank computes the same bias without talking to the others,
// and the checkpoint is not changed (the bias joins the router's logit bias in memory).
#include <cstdint>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar {

// Throws expar::Error naming --router-skew, the value and the rule unless s is finite and >= 0.
void check_router_skew(double exponent);

// The popularity rank (1 = the hottest) of each of `num_experts` experts in MoE layer `layer` (>= 0; a
// one-layer benchmark passes 0): a permutation of 1..E drawn from (`seed`, layer) (Fisher-Yates on the
// counter-based generator, layer l taking the counters [l·E, (l+1)·E)).
std::vector<int> router_skew_ranks(int num_experts, uint64_t seed, int layer);

// [E] f32: −s · ln(rank_e); all zeros for s = 0.
Tensor router_skew_bias(double exponent, int num_experts, uint64_t seed, int layer);

// Replaces `logit_bias` ([E] f32, or undefined: zeros) by logit_bias + router_skew_bias.
void add_router_skew(Tensor& logit_bias, double exponent, int num_experts, uint64_t seed, int layer);

}  // namespace expar
