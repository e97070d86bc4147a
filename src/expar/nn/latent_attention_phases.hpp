#pragma once
// The phases of training multi-head latent attention, shared by the whole-sequence functions
// (latent_attention.cpp) and the context-parallel ones (context_parallel_attention.cpp). As for ordinary
// attention (attention_phases.hpp) the two differ only in where the latent rows a chunk of queries attends to
// come from (its own rows, or every earlier chunk's gathered over the CP group) and where their gradients go
// (the same rows, or reduce-scattered back to their owners):
//   forward:  project_queries, project_latents -> [gather latent rows] -> attend_latents
//   backward: attend_latents_backward -> [reduce-scatter latent-row gradients] -> input_backward
// The latent rows (c_n then k_rope after RoPE, kv_lora + rope floats) are what travels: the keys and values
// are expanded from them where the queries are.
// Not a public interface: model code calls latent_attention.hpp or context_parallel_attention.hpp.
#include <cstdint>

#include "expar/nn/latent_attention.hpp"

namespace expar::nn::latent_phases {

// The weights against the shape and the Rope (matrices as stored, gains F32); returns the model width d.
int64_t check_weights(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                      const char* layer);

// What a training backward needs: F32 weights and gradients of their shapes, `saved` as a training forward
// left it (batch, seq, past, key_rows = past + seq), grad_y [B·seq, d].
void check_backward_call(const LatentAttentionShape& s, const LatentAttentionWeights& w,
                         const LatentAttentionSaved& saved, const Tensor& grad_y,
                         const LatentAttentionGrads& grads, int64_t d, const char* layer);

// The queries of x [n, d] after RoPE at `positions`, [n, H·(nope+rope)]; with `saved`, the q_a norm's state
// and output.
Tensor project_queries(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                       const Tensor& x, const int32_t* positions, LatentAttentionSaved* saved);

// The latent rows of x [n, d], [n, kv_lora + rope]: c_n = RMSNorm_{kv_a_norm}(c), then k_rope after RoPE
// (a cache row's layout); with `norm`, the norm's state.
Tensor project_latents(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                       const Tensor& x, const int32_t* positions, RmsNormSaved* norm);

// From `rows` latent rows (c_n then k_rope, row stride ld): keys k [rows, H·(nope+rope)], head h's
// [k_nope_h, k_rope], and values v [rows, H·v], through kv = c_n·Wkv_bᵀ.
void expand_keys_values(const LatentAttentionShape& s, const Tensor& wkv_b, const float* latent, int64_t ld,
                        int64_t rows, float* k, float* v);

// Per sequence b: the `seq` queries q[b·seq + i] (after RoPE) at positions past + i attend causally to the
// keys and values expanded from the latent rows latent[b·(past + seq) + j] (positions j). Returns
// y [B·seq, d]. With `saved`, fills batch, seq, past, key_rows, q, latent, k, v, probs and context (the
// caller fills x, positions and the norms' states).
Tensor attend_latents(const LatentAttentionShape& s, const LatentAttentionWeights& w, const Tensor& q,
                      const Tensor& latent, int64_t batch, int64_t seq, int64_t past,
                      LatentAttentionSaved* saved);

struct LatentRowGrads {
  Tensor q;       // [B·seq, H·(nope+rope)]: of the queries after RoPE
  Tensor latent;  // [B·key_rows, kv_lora + rope]: of every attended latent row, c_n then k_rope after RoPE
};
// The adjoint of attend_latents: adds into grads.wo and grads.wkv_b (this rank's queries' share).
LatentRowGrads attend_latents_backward(const LatentAttentionShape& s, const LatentAttentionWeights& w,
                                       const LatentAttentionSaved& saved, const Tensor& grad_y,
                                       LatentAttentionGrads& grads);

// From the gradients of this rank's own queries and latent rows [B·seq, *] (after RoPE): inverse RoPE at
// saved.positions, the norms' backward, then the input projections. Returns grad_x [B·seq, d]; adds into
// the gradients of Wq (or Wq_a, q_a_norm, Wq_b), Wkv_a and kv_a_norm.
Tensor input_backward(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                      const LatentAttentionSaved& saved, Tensor grad_q, Tensor grad_latent,
                      LatentAttentionGrads& grads);

}  // namespace expar::nn::latent_phases
