#pragma once
// Context-parallel training attention (seed 000, Appendix F; `expar train --cp C`): the C ranks of a CP
// group hold chunks of the same B sequences of length S = C·S_c, rank c the positions [c·S_c, (c+1)·S_c).
// Each rank projects its own rows (biases, q/k norms, RoPE at the rows' true positions), then the keys and
// values are all-gathered over the CP group and each chunk's queries attend to the chunks up to their own
// (the causal mask, the sliding window and the sinks of AttentionOptions apply across chunks exactly as on
// the whole sequence: attend() sees queries at positions [c·S_c, (c+1)·S_c) against keys [0, (c+1)·S_c)).
// Backward is the adjoint: the gradients of the gathered keys and values are reduce-scattered back to the
// ranks that own those rows, which then run the projections' backward on their own rows.
//
// The result equals attention_forward/backward on the whole sequence, chunked: y and grad_x rows of chunk c,
// and weight and option gradients whose sum over the CP group is the whole sequence's (the caller reduces
// them, with the other dense gradients, over the DenseGrad group).
#include <cstdint>

#include "expar/nn/attention.hpp"
#include "expar/nn/latent_attention.hpp"

namespace expar {
class Comm;
}

namespace expar::nn {

// x [B·S_c, d]: chunk cp.rank() of B sequences, row b·S_c + s at position cp.rank()·S_c + s. Collective over
// `cp` (every member passes the same batch and chunk). Returns y [B·S_c, d]; `saved` as attention_forward's
// with past = cp.rank()·S_c and the gathered keys and values of chunks 0 .. cp.rank().
Tensor cp_attention_forward(Comm& cp, const AttentionShape& shape, const Rope& rope,
                            const AttentionWeights& weights, const Tensor& x, int64_t batch, int64_t chunk,
                            AttentionSaved* saved, const AttentionOptions& options = {});

// Returns grad_x [B·S_c, d] of this rank's rows; adds this chunk's share into grads and option_grads.
// Collective over the same `cp` group as the forward.
Tensor cp_attention_backward(Comm& cp, const AttentionShape& shape, const Rope& rope,
                             const AttentionWeights& weights, const AttentionSaved& saved,
                             const Tensor& grad_y, AttentionGrads& grads,
                             const AttentionOptions& options = {},
                             AttentionOptionGrads* option_grads = nullptr);

// Multi-head latent attention (latent_attention.hpp) over the same CP group: each rank projects its own rows'
// queries and latent rows (c_n after kv_a_norm and k_rope after RoPE at the rows' true positions), the
// LATENT rows are all-gathered (kv_lora + rope floats a token, far fewer than the expanded keys and values),
// and each rank expands the keys and values of positions [0, (cp.rank() + 1)·S_c) from them through Wkv_b
// and attends. Backward: the gradients of the gathered latent rows (after the expansion's backward, which
// adds this rank's share into grads.wkv_b) are reduce-scattered back to their owners, which run the latent
// norm, RoPE and projection backward on their own rows. y and grad_x are chunk cp.rank()'s rows of the
// whole sequence's; each weight gradient is this chunk's share, their sum over the group the whole
// sequence's (the caller reduces them, as for cp_attention_backward). With TP, as latent_attention.hpp
// says: the local heads' partial sums.
Tensor cp_latent_attention_forward(Comm& cp, const LatentAttentionShape& shape, const Rope& rope,
                                   const LatentAttentionWeights& weights, const Tensor& x, int64_t batch,
                                   int64_t chunk, LatentAttentionSaved* saved);

Tensor cp_latent_attention_backward(Comm& cp, const LatentAttentionShape& shape, const Rope& rope,
                                    const LatentAttentionWeights& weights, const LatentAttentionSaved& saved,
                                    const Tensor& grad_y, LatentAttentionGrads& grads);

}  // namespace expar::nn
