#pragma once
// Expert-weight loaders for Hugging Face MoE layouts, each the expert-parallel wrapper around a TP-sharding
// base loader (seed 002, "Weight Loading"): only this rank's experts, and of each only the intermediate
// shard [i0, i1) of its EP_TP rank (gate/up rows, down columns). Weights come out in expar's orientation:
// w1 (gate) [E_L, n, H], w3 (up) [E_L, n, H], w2 (down) [E_L, H, n] with n = i1 - i0. The names are
// model/weight_names.hpp's, gpt-oss's stacked layout model/gpt_oss_layout.hpp's; training's loads read
// through these loaders too (train/checkpoint.cpp).
//
//  Mixtral   model.layers.L.block_sparse_moe.experts.J.{w1,w3,w2}.weight     ([I, H], [I, H], [H, I])
//  Qwen-MoE  model.layers.L.mlp.experts.J.{gate,up,down}_proj.weight         ([I, H], [I, H], [H, I])
//            model.layers.L.mlp.shared_expert.{gate,up,down}_proj.weight and mlp.shared_expert_gate.weight
//            [1, H]: the shared expert's output is scaled by sigmoid(x · gate)
//  gpt-oss   model.layers.L.mlp.experts.gate_up_proj [E, H, 2I] (gate = even columns, up = odd columns),
//            gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias [E, H]; the router
//            mlp.router.weight [E, H] has a bias [E]; the activation is the clamped SwiGLU below.
#include <cstdint>
#include <span>

#include "expar/model/tensor_store.hpp"
#include "expar/moe/expert_mlp.hpp"

namespace expar {

ExpertWeights load_mixtral_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1);
ExpertWeights load_qwen_moe_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                    int64_t i0, int64_t i1);

struct QwenSharedExpert {
  Tensor w1, w3, w2;  // [n, H], [n, H], [H, n]: intermediate shard [s0, s1)
  Tensor gate;        // [1, H]: y_shared · sigmoid(x · gateᵀ), replicated
};
QwenSharedExpert load_qwen_shared_expert(const TensorStore& store, int layer, int64_t s0, int64_t s1);

struct GptOssExperts {
  ExpertWeights weights;
  Tensor b1, b3;  // [E_L, n]: gate and up biases of the shard
  Tensor b2;      // [E_L, H]: the down bias; only on the EP_TP rank that owns it (owns_down_bias), so that
                  // summing the shards' partial outputs adds it once; undefined elsewhere
};
GptOssExperts load_gpt_oss_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1, bool owns_down_bias);
// The same with the experts' matrices as the checkpoint stores them when it holds them in MXFP4
// (NAME_blocks / NAME_scales) and the shard [i0, i1) covers whole 32-value blocks: weights.mxfp4 set (of the
// local experts, the shard's blocks and scales copied as they are: gate_up rows [2·i0, 2·i1), down input
// blocks [i0/32, i1/32); so the held Mxfp4Experts computes its rows [0, i1 - i0)), the biases as above.
// Otherwise load_gpt_oss_experts.
GptOssExperts load_gpt_oss_experts_as_stored(const TensorStore& store, int layer,
                                             std::span<const int> local_experts, int64_t i0, int64_t i1,
                                             bool owns_down_bias);

// gpt-oss's clamped SwiGLU is moe/expert_mlp.hpp's gpt_oss_swiglu (the experts run there).

}  // namespace expar
