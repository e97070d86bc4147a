#pragma once
// gpt-oss's stacked expert layout (transformers' GptOssExperts), per layer L:
//   model.layers.L.mlp.experts.gate_up_proj       [E, d, 2h]  [in, out]: gate = even columns, up = odd ones
//   model.layers.L.mlp.experts.gate_up_proj_bias  [E, 2h]     gate bias even, up bias odd
//   model.layers.L.mlp.experts.down_proj          [E, h, d]   [in, out]
//   model.layers.L.mlp.experts.down_proj_bias     [E, d]
// and the conversion of one expert from expar's ExpertWeights (w1/w3 [h, d], w2 [d, h], b1/b3 [h], b2 [d])
// into it, for training's saves. Every reader (the engine, training's loads) reads it through
// model/hf_experts.hpp's load_gpt_oss_experts, which slices these tensors for expert TP.
#include <array>
#include <cstdint>
#include <string>

#include "expar/core/tensor.hpp"
#include "expar/moe/expert_mlp.hpp"

namespace expar {

enum GptOssExpertTensor : int { kGateUp = 0, kGateUpBias = 1, kDown = 2, kDownBias = 3 };
inline constexpr int kGptOssExpertTensors = 4;

// The stacked tensors' names of layer `layer`, in GptOssExpertTensor order.
std::array<std::string, kGptOssExpertTensors> gpt_oss_expert_names(int layer);
// One expert's shape of each tensor (without the leading E): [d, 2h], [2h], [h, d], [d].
Shape gpt_oss_expert_shape(GptOssExpertTensor which, int64_t d, int64_t h);

// Local expert `l` of `w` (with its biases) written as one expert of each stacked tensor (f32, the shapes
// above).
void gpt_oss_expert_to_hf(const ExpertWeights& w, int64_t l,
                          const std::array<float*, kGptOssExpertTensors>& out);

}  // namespace expar
