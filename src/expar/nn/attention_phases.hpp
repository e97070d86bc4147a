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

// The widths of one attention head: queries and keys of `qk` values, values (and the context) of `v`
// values, scores scaled by `scale` before the softmax. Ordinary attention is square (qk = v = head_dim,
// scale 1/sqrt(head_dim)); multi-head latent attention (latent_attention.hpp) has qk = nope + rope ≠ v and
// the checkpoint's softmax_scale, and its absorbed form attends with keys [c, k_rope] (qk = kv_lora + rope)
// whose first kv_lora values are also the values (v = kv_lora, the same rows).
struct HeadWidths {
  int64_t qk = 0, v = 0;
  float scale = 0.0f;
  static HeadWidths square(int64_t head_dim);
};

// One head: tq queries at positions [past, past + tq) against tk = past + tq keys; query i sees keys
// [lo_i, past + i] with lo_i = 0, or past + i - window + 1 with a window. `sink` (nullable) is one extra
// logit in the softmax denominator. q [tq, widths.qk] (row stride ldq), k [tk, widths.qk] (ldk),
// v [tk, widths.v] (ldv). Writes probs [tq, tk] (zero where masked) and out [tq, widths.v] (row stride ldo).
// Query rows go through the products in blocks of kAttentionRowBlock, each against only the keys its last
// row sees.
void attend_head(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v, int64_t ldv,
                 int64_t tq, int64_t past, const HeadWidths& widths, float* probs, float* out, int64_t ldo,
                 int64_t window, const float* sink);
// The square form (qk = v = head_dim, k and v with one row stride ldkv).
inline void attend_head(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv, int64_t tq,
                        int64_t past, int64_t head_dim, float* probs, float* out, int64_t ldo, int64_t window,
                        const float* sink) {
  attend_head(q, ldq, k, ldkv, v, ldkv, tq, past, HeadWidths::square(head_dim), probs, out, ldo, window,
              sink);
}
inline constexpr int64_t kAttentionRowBlock = 64;

// One new token's `group` query heads that share a key/value head (grouped-query attention; group 1 is
// attend_head with tq = 1), at position `past` against its past + 1 keys, as the rows of one product each:
// q [group, widths.qk] and out [group, widths.v] contiguous (adjacent heads of one row), probs [group,
// past + 1]; k [past + 1, widths.qk] (row stride ldk), v [past + 1, widths.v] (ldv); sinks (nullable) one
// logit per head of the group. The decode step's attention: each cached key and value row is read once for
// the whole group instead of once per head (multi-head latent attention's absorbed form: all its heads
// against the one latent row).
void attend_group_one_token(const float* q, int64_t group, const float* k, int64_t ldk, const float* v,
                            int64_t ldv, int64_t past, const HeadWidths& widths, float* probs, float* out,
                            int64_t window, const float* sinks);
// The square form.
inline void attend_group_one_token(const float* q, int64_t group, const float* k, const float* v,
                                   int64_t ldkv, int64_t past, int64_t head_dim, float* probs, float* out,
                                   int64_t window, const float* sinks) {
  attend_group_one_token(q, group, k, ldkv, v, ldkv, past, HeadWidths::square(head_dim), probs, out, window,
                         sinks);
}

// The heads of a batched attention: n_heads query heads, n_kv_heads key/value heads (dividing n_heads),
// each of `widths`. Rows hold the heads side by side: q [.., n_heads·qk], k [.., n_kv_heads·qk],
// v [.., n_kv_heads·v], the context [.., n_heads·v].
struct AttendHeads {
  int64_t n_heads = 0, n_kv_heads = 0;
  HeadWidths widths;
};

// The argument checks every training call makes (weights against the shape and Rope, options without
// inference-only parts); returns the widths.
// A cached step's room for sequence i (attention and latent attention alike): its cache holds `length` of
// `capacity` positions and adds `adds`, all within the Rope's positions; throws expar::Error naming them.
void check_cache_room(const char* layer, size_t i, int64_t length, int64_t adds, int64_t capacity,
                      const Rope& rope);

Dims check_training_call(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const AttentionOptions& options, const char* layer);

// Positions of B sequences' rows [b·seq, (b+1)·seq) that start at position `past`: int32 [B·seq].
Tensor chunk_positions(int64_t batch, int64_t seq, int64_t past);

struct Qkv {
  Tensor q, k, v;  // [n, qd], [n, kd], [n, kd]: after biases, q/k norms and RoPE (v: bias only)
};
// The projections of x [n, d] at `positions`; with `saved`, the q/k norms' inputs and 1/rms go into it, and
// x as the weight gradients read it (saved.x: nn/linear_products.hpp's saved_operand).
Qkv project_qkv(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                const Dims& dims, const Tensor& x, const Tensor& positions, const AttentionOptions& options,
                AttentionSaved* saved);

// Per sequence b and head: the `seq` queries q[b·seq + i] at positions past + i attend to the first
// past + seq of the `key_rows` keys k[b·key_rows + j] (at positions j), within `window` (0: none), with one
// sink logit per head when `sinks` is defined and not empty. Returns the context [B·seq, n_heads·v]; probs,
// when defined, receives [B, H, seq, past + seq] (zero where masked).
Tensor attend(const AttendHeads& heads, const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
              int64_t seq, int64_t past, int64_t key_rows, int64_t window, const Tensor& sinks,
              Tensor* probs);
// Ordinary attention's: the square heads of `shape`, the window and sinks of `options`.
Tensor attend(const AttentionShape& shape, const Dims& dims, const Tensor& q, const Tensor& k,
              const Tensor& v, int64_t batch, int64_t seq, int64_t past, int64_t key_rows,
              const AttentionOptions& options, Tensor* probs);

// y = context·Woᵀ (+ bo); with `saved`, the context as Wo's weight gradient reads it (saved.context:
// saved_operand).
Tensor output_forward(const Dims& dims, const AttentionWeights& weights, const Tensor& context,
                      const AttentionOptions& options, AttentionSaved* saved);

// Checks `saved` (as attention_forward or the CP forward left it), grad_y, grads and option_grads.
void check_backward_call(const AttentionShape& shape, const Dims& dims, const AttentionWeights& weights,
                         const AttentionSaved& saved, const Tensor& grad_y, const AttentionGrads& grads,
                         const AttentionOptions& options, const AttentionOptionGrads* option_grads,
                         const char* layer);

// grad_context [n, qd]; adds into grads.wo and option_grads->bo.
Tensor output_backward(const Dims& dims, const AttentionWeights& weights, const AttentionSaved& saved,
                       const Tensor& grad_y, AttentionGrads& grads, const AttentionOptions& options,
                       AttentionOptionGrads* option_grads);

struct QkvGrads {
  Tensor q;     // [B·seq, n_heads·qk]: the queries' rows
  Tensor k, v;  // [B·key_rows, n_kv_heads·qk], [B·key_rows, n_kv_heads·v]: every key row (zero where no
                // query saw it)
};
// The adjoint of attend over the probabilities it saved (exactly zero where the causal mask or a window
// hid a key, so the window needs no argument) and its q, k, v. With sinks defined and not empty, their
// gradient is added into grad_sinks [n_heads].
QkvGrads attend_backward(const AttendHeads& heads, const Tensor& probs, const Tensor& q, const Tensor& k,
                         const Tensor& v, int64_t batch, int64_t seq, int64_t past, int64_t key_rows,
                         const Tensor& grad_context, const Tensor& sinks, Tensor* grad_sinks);
// Ordinary attention's, over `saved`; adds the sinks' gradient into option_grads->sinks.
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
