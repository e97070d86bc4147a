#pragma once
// Multi-head latent attention (MLA: DeepSeek-V2 and V3, transformers' modeling_deepseek_v3.py), for H heads
// and model width d, nope = qk_nope_head_dim, rope = qk_rope_head_dim, v = v_head_dim:
//   q = x·Wqᵀ (q_lora_rank 0; Wq [H·(nope+rope), d]), or
//   q = RMSNorm_{q_a_norm}(x·Wq_aᵀ)·Wq_bᵀ (Wq_a [q_lora, d], Wq_b [H·(nope+rope), q_lora]);
//       per head h: q_nope_h (the first nope values), then q_rope_h (rope values).
//   kv_a = x·Wkv_aᵀ (Wkv_a [kv_lora + rope, d]): c (kv_lora values), then k_rope (rope values).
//   c_n = RMSNorm_{kv_a_norm}(c); kv = c_n·Wkv_bᵀ (Wkv_b [H·(nope+v), kv_lora]): per head k_nope_h, v_h.
//   RoPE on every q_rope_h and on k_rope: one rope key shared by all heads, like multi-query attention.
//   key_h = [k_nope_h, k_rope], query_h = [q_nope_h, q_rope_h].
//   context_h = softmax(query_h·key_hᵀ · softmax_scale + causal)·v_h; y = concat_h(context_h)·Woᵀ.
//   Wo [d, H·v]. No biases.
// The Rope must have head_dim == qk_rope_head_dim; DeepSeek checkpoints pair (2i, 2i + 1): build it with
// RopePairing::Interleaved (the caller's choice; any pairing works here).
//
// Tensor parallelism: a rank passes only its heads' rows of Wq / Wq_b / Wkv_b and its heads' columns of Wo
// (n_heads = local heads); Wq_a, q_a_norm, Wkv_a and kv_a_norm are replicated. y is a partial sum over the
// local heads (the caller all-reduces it); so are the backward's grad_x and the gradients of the replicated
// weights (Wq_a, q_a_norm, Wkv_a, kv_a_norm): the caller all-reduces them too.
//
// Inference keeps one compressed cache row per position: c_n and the rotated k_rope (kv_lora + rope
// floats, shared by every head), from which two forms attend:
//   Expanded: k_nope and v of every attended position from c_n·Wkv_bᵀ, then ordinary attention (prefill).
//   Absorbed: per head q_lat_h = W_UK_hᵀ·q_nope_h (W_UK_h: head h's nope rows of Wkv_b, [nope, kv_lora]),
//             scores (q_lat_h·c_n_j + q_rope_h·k_rope_j)·scale, o_lat_h = Σ_j P_j c_n_j, and
//             context_h = W_UV_h·o_lat_h (W_UV_h: head h's v rows of Wkv_b). A decode step reads the cache
//             once for all heads (the H heads are one query group against the one latent row).
// Both give the training forward's result on the whole sequence (within f32 rounding).
#include <cstdint>
#include <span>

#include "expar/core/tensor.hpp"
#include "expar/nn/rmsnorm.hpp"
#include "expar/nn/rope.hpp"

namespace expar::nn {

struct LatentAttentionShape {
  int64_t n_heads = 0;           // heads held here
  int64_t q_lora_rank = 0;       // 0: q = x·Wqᵀ; > 0: through Wq_a, q_a_norm and Wq_b
  int64_t kv_lora_rank = 0;      // the latent's width
  int64_t qk_nope_head_dim = 0;  // per head, the query/key values without RoPE
  int64_t qk_rope_head_dim = 0;  // per head (and the one shared key), the values with RoPE; even
  int64_t v_head_dim = 0;
  double softmax_scale = 0.0;  // the scores' scale (the caller's (nope+rope)^-0.5 · mscale²)
  float norm_eps = 1e-6f;      // eps of q_a_norm and kv_a_norm

  // Throws expar::Error naming the bad field.
  void validate() const;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t q_width() const { return n_heads * qk_head_dim(); }             // rows of Wq / Wq_b
  int64_t kv_a_width() const { return kv_lora_rank + qk_rope_head_dim; }  // rows of Wkv_a; a cache row
  int64_t kv_b_width() const { return n_heads * (qk_nope_head_dim + v_head_dim); }  // rows of Wkv_b
  int64_t context_width() const { return n_heads * v_head_dim; }                    // columns of Wo
};

// Handles sharing storage with the model's parameters. Either wq (q_lora_rank == 0) or wq_a, q_a_norm and
// wq_b (q_lora_rank > 0) are defined; the others are left undefined (or empty). Matrices may be held as
// F32, BF16, F16 or block-scaled FP8 in inference (core/weight_view.hpp); training's backward needs F32.
// The norm gains are F32.
struct LatentAttentionWeights {
  Tensor wq;         // [H·(nope+rope), d]
  Tensor wq_a;       // [q_lora, d]
  Tensor q_a_norm;   // [q_lora]
  Tensor wq_b;       // [H·(nope+rope), q_lora]
  Tensor wkv_a;      // [kv_lora + rope, d]
  Tensor kv_a_norm;  // [kv_lora]
  Tensor wkv_b;      // [H·(nope+v), kv_lora]
  Tensor wo;         // [d, H·v]
};

// F32, shaped like the weights (undefined where the weight is); backward ADDS into them.
using LatentAttentionGrads = LatentAttentionWeights;

// S: the query rows per sequence held here; K = past + S key rows per sequence (the whole sequence: past 0,
// K = S; context parallelism, context_parallel_attention.hpp: the chunks up to this rank's).
struct LatentAttentionSaved {
  int64_t batch = 0, seq = 0;
  int64_t past = 0;      // position of each sequence's first query row
  int64_t key_rows = 0;  // latent (key/value) rows per sequence: past + seq
  Tensor x;              // input [B·S, d]
  Tensor positions;      // int32 [B·S]: past + s for row b·S + s
  Tensor q_a;            // q_lora_rank > 0: RMSNorm_{q_a_norm}(x·Wq_aᵀ) [B·S, q_lora]
  RmsNormSaved q_norm;   // q_lora_rank > 0: the norm's input and 1/rms
  Tensor latent;         // [B·K, kv_lora + rope]: c_n then k_rope after RoPE (a cache row's layout)
  RmsNormSaved kv_norm;  // of this rank's own B·S rows
  Tensor q;              // after RoPE [B·S, H·(nope+rope)]
  Tensor k;              // [B·K, H·(nope+rope)]: per head [k_nope_h, k_rope]
  Tensor v;              // [B·K, H·v]
  Tensor probs;          // [B, H, S, K], exactly zero where the causal mask hides
  Tensor context;        // [B·S, H·v]
};

// Training. x [B·S, d] holds B sequences of S tokens at positions 0..S-1 (sequence b in rows
// [b·S, (b+1)·S)). Returns y [B·S, d]. `saved` may be nullptr.
Tensor latent_attention_forward(const LatentAttentionShape& shape, const Rope& rope,
                                const LatentAttentionWeights& weights, const Tensor& x, int64_t batch,
                                int64_t seq, LatentAttentionSaved* saved);

// Returns grad_x [B·S, d]; ADDS the weight gradients into `grads`. The weights must be F32.
Tensor latent_attention_backward(const LatentAttentionShape& shape, const Rope& rope,
                                 const LatentAttentionWeights& weights, const LatentAttentionSaved& saved,
                                 const Tensor& grad_y, LatentAttentionGrads& grads);

// One sequence's compressed cache for one layer: row p holds position p's c_n (after kv_a_norm) and then its
// k_rope after RoPE, kv_lora + rope floats for all the heads.
struct LatentKvCache {
  Tensor latent;       // [capacity, kv_lora + rope]
  int64_t length = 0;  // positions [0, length) hold valid rows
  int64_t capacity() const { return latent.dim(0); }
  static LatentKvCache create(int64_t capacity, const LatentAttentionShape& shape);
};

enum class LatentForm : uint8_t {
  Expanded,  // keys and values of every attended position from c_n·Wkv_bᵀ (prefill's)
  Absorbed   // Wkv_b folded into the query and the context: attend the latent rows (decode's)
};

// Inference with caches. x [Σ new_tokens, d]: sequence i's new_tokens[i] tokens are consecutive rows, at
// positions [caches[i]->length, caches[i]->length + new_tokens[i]). Their latent rows are appended to the
// cache (length advances); each new token attends causally to every cached position and the new ones up to
// itself. Returns y [Σ new_tokens, d] (with TP a partial sum over the local heads). A bad call throws
// before any cache is touched.
Tensor latent_attention_forward_cached(const LatentAttentionShape& shape, const Rope& rope,
                                       const LatentAttentionWeights& weights, const Tensor& x,
                                       std::span<const int64_t> new_tokens,
                                       std::span<LatentKvCache* const> caches, LatentForm form);

}  // namespace expar::nn
