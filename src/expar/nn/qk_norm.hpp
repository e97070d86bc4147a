#pragma once
// The q/k RMSNorm of AttentionOptions (Qwen3: per head; OLMoE: over the whole projection, its sums of squares
// completed by options.sum_squares under TP), applied after the projections and biases, before RoPE. Kept
// out of attention.cpp: the training path never calls it.
#include <cstdint>

#include "expar/nn/attention.hpp"

namespace expar::nn {

// options.qk_norm on q [rows, n_heads·head_dim] and k [rows, n_kv_heads·head_dim], in place.
void apply_qk_norm(const AttentionShape& shape, const AttentionOptions& options, float* q, float* k,
                   int64_t rows);

}  // namespace expar::nn
