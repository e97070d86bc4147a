#pragma once
// The phases of training attention, shared by the full-sequence functions (attention.cpp) and the
// context-parallel ones (context_parallel_attention.cpp). The two differ only in where the keys and values
// a chunk of queries attends to come from (its own rows, or every earlier chunk's gathered over the CP
// group) and where their gradients go (the same rows, or reduce-scattered back to their owners):
//   forward:  project_qkv -> [gather keys/values] -> attend -> output_forward
//   backward: output_backward -> attend_backward -> [reduce-scatter key/value gradients] -> input_backward
// Not a public interface: model code calls attention.hpp or context_parallel_attention.hpp.
#include <cstdint>

#include "expar/nn/attention.hpp"

namespace expar::nn::phases {

struct Dims {
  int64_t d;   // model width
  int64_t qd;  // n_heads·head_dim
  int64_t kd;  // n_kv_heads·head_dim
};

// Weights against the shape and Rope; returns the widths.
Dims check_weights(const AttentionShape& shape, const Rope& rope, const AttentionWeights& w,
                   const char* layer);
// The options' tensors against the widths (training and inference alike).
void check_options(const AttentionShape& shape, const Dims& dims, const AttentionOptions& o,
                   const char* layer);

// y [n, out] = x [n, in] · wᵀ (w [out, in]).
void project(const Tensor& x, const Tensor& w, float* y, bool accumulate);
// Adds bias [cols] (when defined and not empty) to every row of y [rows, cols].
void add_bias(float* y, int64_t rows, int64_t cols, const Tensor& bias);

// One head: tq queries at positions [past, past + tq) against tk = past + tq keys; query i sees keys
// [lo_i, past + i] with lo_i = 0, or past + i - window + 1 with a window. `sink` (nullable) is one extra
// logit in the softmax denominator. Writes probs [tq, tk] (zero where masked) and out [tq, head_dim] (row
// stride ldo).
// Query rows go through the products in blocks of kAttentionRowBlock, each against only the keys its last
// row sees.
void attend_head(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv, int64_t tq,
                 int64_t past, int64_t head_dim, float* probs, float* out, int64_t ldo, int64_t window,
                 const float* sink);
inline constexpr int64_t kAttentionRowBlock = 64;

// One new token's `group` query heads that share a key/value head (grouped-query attention; group 1 is
// attend_head with tq = 1), at position `past` against its past + 1 keys, as the rows of one product each:
// q [group, head_dim] and out [group, head_dim] contiguous (adjacent heads of one row), probs [group,
// past + 1]; sinks (nullable) one logit per head of the group. The decode step's attention: each cached
// key and value row is read once for the whole group instead of once per head.
void attend_group_one_token(const float* q, int64_t group, const float* k, const float* v, int64_t ldkv,
                            int64_t past, int64_t head_dim, float* probs, float* out, int64_t window,
                            const float* sinks);

// The argument checks every training call makes (weights against the shape and Rope, options without
// inference-only parts); returns the widths.
Dims check_training_call(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const AttentionOptions& options, const char* layer);

// Positions of B sequences' rows [b·seq, (b+1)·seq) that start at position `past`: int32 [B·seq].
Tensor chunk_positions(int64_t batch, int64_t seq, int64_t past);

struct Qkv {
  Tensor q, k, v;  // [n, qd], [n, kd], [n, kd]: after biases, q/k norms and RoPE (v: bias only)
};
// The projections of x [n, d] at `positions`; with `saved`, the q/k norms' inputs and 1/rms go into it.
Qkv project_qkv(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                const Dims& dims, const Tensor& x, const Tensor& positions, const AttentionOptions& options,
                AttentionSaved* saved);

// Per sequence b and head: the `seq` queries q[b·seq + i] at positions past + i attend to the first
// past + seq of the `key_rows` keys k[b·key_rows + j] (at positions j). Returns the context [B·seq, qd];
// probs, when defined, receives [B, H, seq, past + seq] (zero where masked).
Tensor attend(const AttentionShape& shape, const Dims& dims, const Tensor& q, const Tensor& k,
              const Tensor& v, int64_t batch, int64_t seq, int64_t past, int64_t key_rows,
              const AttentionOptions& options, Tensor* probs);

// y = context·Woᵀ (+ bo).
Tensor output_forward(const Dims& dims, const AttentionWeights& weights, const Tensor& context,
                      const AttentionOptions& options);

// Checks `saved` (as attention_forward or the CP forward left it), grad_y, grads and option_grads.
void check_backward_call(const AttentionShape& shape, const Dims& dims, const AttentionSaved& saved,
                         const Tensor& grad_y, const AttentionGrads& grads, const AttentionOptions& options,
                         const AttentionOptionGrads* option_grads, const char* layer);

// grad_context [n, qd]; adds into grads.wo and option_grads->bo.
Tensor output_backward(const Dims& dims, const AttentionWeights& weights, const AttentionSaved& saved,
                       const Tensor& grad_y, AttentionGrads& grads, const AttentionOptions& options,
                       AttentionOptionGrads* option_grads);

struct QkvGrads {
  Tensor q;     // [B·seq, qd]: the queries' rows
  Tensor k, v;  // [B·key_rows, kd]: every key row of saved.k / saved.v (zero where no query saw it)
};
// The adjoint of attend over saved.probs; adds the sinks' gradient into option_grads->sinks.
QkvGrads attend_backward(const AttentionShape& shape, const Dims& dims, const AttentionSaved& saved,
                         const Tensor& grad_context, const AttentionOptions& options,
                         AttentionOptionGrads* option_grads);

// From the gradients of this rank's own q, k, v rows [n, *] (after RoPE): inverse RoPE at saved.positions,
// the q/k norms' and biases' backward, then the input projections. Returns grad_x [n, d]; adds into grads
// and option_grads.
Tensor input_backward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                      const Dims& dims, const AttentionSaved& saved, Tensor grad_q, Tensor grad_k,
                      Tensor grad_v, AttentionGrads& grads, const AttentionOptions& options,
                      AttentionOptionGrads* option_grads);

}  // namespace expar::nn::phases
