#pragma once
// Causal multi-head self-attention with rotary position embeddings and grouped key/value heads:
//   q = RoPE(x·Wqᵀ), k = RoPE(x·Wkᵀ), v = x·Wvᵀ
//   per query head h (key/value head h / (n_heads / n_kv_heads)): P = softmax(q_h·k_hᵀ / sqrt(head_dim) +
//   causal) y = concat_h(P·v_h)·Woᵀ
// Weights use the PyTorch orientation: Wq [H·hd, d], Wk and Wv [Hkv·hd, d], Wo [d, H·hd]. The options of
// Hugging Face families (AttentionOptions: q/k/v/o biases, q/k RMSNorm, sinks, a sliding window) apply to
// training (attention_forward/backward, with their gradients) and inference alike; only the TP completion of
// OLMoE's projection norm is inference-only.
//
// Tensor parallelism: the functions see only the heads they are given. A TP rank passes the rows of Wq/Wk/Wv
// and the columns of Wo that belong to its heads (AttentionShape counts the local heads); its y is then a
// partial sum over its heads, and the caller all-reduces y (and, in backward, grad_x) over the TP group.
//
// Inference: attention_forward_cached runs forward only with a KV cache per sequence, for prefill (many new
// tokens) and decode (one new token) alike, and gives the same result as attention_forward on the whole
// sequence, with the same options (q/k/v/o biases: Qwen-MoE, gpt-oss; a learned sink logit per head:
// gpt-oss; q/k norms: Qwen3, OLMoE; a sliding window: Mixtral, gpt-oss's alternate layers).
#include <cstdint>
#include <functional>
#include <span>

#include "expar/core/tensor.hpp"
#include "expar/nn/rmsnorm.hpp"
#include "expar/nn/rope.hpp"

namespace expar::nn {

struct AttentionShape {
  int64_t n_heads = 0;     // query heads held here
  int64_t n_kv_heads = 0;  // key/value heads held here; divides n_heads (== n_heads: plain multi-head)
  int64_t head_dim = 0;
  void validate() const;
};

struct AttentionWeights {  // handles: they share storage with the model's parameters
  Tensor wq;               // [n_heads·head_dim, d]
  Tensor wk;               // [n_kv_heads·head_dim, d]
  Tensor wv;               // [n_kv_heads·head_dim, d]
  Tensor wo;               // [d, n_heads·head_dim]
  // Mixed-precision training (issue #35): BF16 copies of the four f32 matrices (refreshed by the model once
  // per step). When held, the projections' products, forward and backward, are BF16 products with f32
  // accumulation (nn/linear_products.hpp); undefined: f32. Training only (all four or none).
  Tensor wq_bf16{}, wk_bf16{}, wv_bf16{}, wo_bf16{};
};

using AttentionGrads = AttentionWeights;  // same shapes (no copies); backward accumulates into them

// RMSNorm of q and k after their projections (and biases), before RoPE.
enum class QkNorm : uint8_t {
  None,
  PerHead,    // Qwen3: over each head's head_dim values (gains [head_dim], the same for every head)
  Projection  // OLMoE: over the whole projection of every head (gains [heads·head_dim], sliced to the local
              // heads); with TP the sums of squares of the local heads are completed by options.sum_squares
};

// Options of the Hugging Face families; the defaults (all undefined, window 0) give plain attention.
struct AttentionOptions {
  Tensor bq;     // [n_heads·head_dim]: added to x·Wqᵀ before RoPE; undefined: none
  Tensor bk;     // [n_kv_heads·head_dim]: added to x·Wkᵀ before RoPE
  Tensor bv;     // [n_kv_heads·head_dim]
  Tensor bo;     // [d]: added to y (with TP, pass it on one rank only, so the sum over ranks adds it once)
  Tensor sinks;  // [n_heads]: per head, one extra logit exp(sink) in the softmax denominator (gpt-oss); it
                 // takes probability mass but contributes no value
  int64_t window =
      0;  // > 0: the query at position p sees keys at positions (p - window, p]; 0: all of [0, p]
  QkNorm qk_norm = QkNorm::None;
  Tensor q_norm;  // PerHead: [head_dim]; Projection: [n_heads·head_dim], the local heads' gains
  Tensor k_norm;  // PerHead: [head_dim]; Projection: [n_kv_heads·head_dim]
  float qk_norm_eps = 1e-6f;
  // Projection with TP: turns each row's local sums of squares q_ss [rows] and k_ss [rows] into the whole
  // projection's (the engine sums them over the TP group). Empty: the local heads are all the heads.
  // q_norm_total / k_norm_total: the whole projections' widths the completed sums run over.
  std::function<void(float* q_ss, float* k_ss, int64_t rows)> sum_squares;
  int64_t q_norm_total = 0, k_norm_total = 0;
};

// Gradients of the options' parameters (biases, q/k norm gains), shaped like them; undefined where the
// option is absent. attention_backward ADDS into them.
struct AttentionOptionGrads {
  Tensor bq, bk, bv, bo, q_norm, k_norm, sinks;
};

struct AttentionSaved {
  int64_t batch = 0, seq = 0;   // seq: query rows per sequence held here
  int64_t past = 0;             // position of each sequence's first query row (context parallelism: > 0)
  int64_t key_rows = 0;         // key/value rows per sequence in k and v: past + seq
  Tensor x;                     // input [B·S, d]; BF16 under BF16 products (read only by their weight grads)
  Tensor positions;             // int32 [B·S]: past + s for row b·S + s
  Tensor q;                     // after RoPE [B·S, H·hd]
  Tensor k;                     // after RoPE [B·key_rows, Hkv·hd] (with CP: the earlier chunks' too)
  Tensor v;                     // [B·key_rows, Hkv·hd]
  Tensor probs;                 // [B, H, S, key_rows], exactly zero where the causal mask or window hides
  Tensor context;               // P·v per head, before the output projection [B·S, H·hd]; BF16 likewise
  RmsNormSaved q_norm, k_norm;  // options.qk_norm: the norms' inputs (after the biases) and 1/rms
};

// x [B·S, d] holds B sequences of length S, sequence b in rows [b·S, (b+1)·S), token s at position s.
// Returns y [B·S, d]. `saved` may be nullptr (inference without cache). `options`: biases, q/k norms,
// sinks and a window (no sum_squares: every head is here).
Tensor attention_forward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const Tensor& x, int64_t batch, int64_t seq, AttentionSaved* saved,
                         const AttentionOptions& options = {});

// Returns grad_x [B·S, d]; accumulates the weight gradients into `grads` and, for the options' parameters,
// into `option_grads` (required when `options` has biases or q/k norms). `options` as in the forward.
Tensor attention_backward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                          const AttentionSaved& saved, const Tensor& grad_y, AttentionGrads& grads,
                          const AttentionOptions& options = {}, AttentionOptionGrads* option_grads = nullptr);

// One sequence's cache for one layer, for the key/value heads held here.
// Head-major: a key/value head's positions are contiguous, so a decode step's attention reads each head's
// keys and values as one stream (position-major, a head's 64 floats of every position lay 2 KiB apart at
// Mixtral's 8 key/value heads).
struct KvCache {
  Tensor k;            // [n_kv_heads, capacity, head_dim], keys after RoPE
  Tensor v;            // [n_kv_heads, capacity, head_dim]
  int64_t length = 0;  // positions [0, length) hold valid entries
  int64_t capacity() const { return k.dim(1); }
  static KvCache create(int64_t capacity, const AttentionShape& shape);
};

// Forward with KV caches. x [Σ new_tokens, d]: sequence i's new_tokens[i] tokens are consecutive rows, at
// positions [caches[i]->length, caches[i]->length + new_tokens[i]). Their keys and values are appended to the
// cache (length advances); each new token attends to every cached position and to the new tokens up to
// itself (within options.window when set). Returns y [Σ new_tokens, d].
Tensor attention_forward_cached(const AttentionShape& shape, const Rope& rope,
                                const AttentionWeights& weights, const Tensor& x,
                                std::span<const int64_t> new_tokens, std::span<KvCache* const> caches,
                                const AttentionOptions& options = {});

}  // namespace expar::nn
