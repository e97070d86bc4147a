#pragma once
// gpt-oss's stacked expert layout (transformers' GptOssExperts), per layer L:
//   model.layers.L.mlp.experts.gate_up_proj       [E, d, 2h]  [in, out]: gate = even columns, up = odd ones
//   model.layers.L.mlp.experts.gate_up_proj_bias  [E, 2h]     gate bias even, up bias odd
//   model.layers.L.mlp.experts.down_proj          [E, h, d]   [in, out]
//   model.layers.L.mlp.experts.down_proj_bias     [E, d]
// and the conversion of one expert between it and expar's ExpertWeights (w1/w3 [h, d], w2 [d, h], b1/b3
// [h], b2 [d]) for training's saves and loads. (The inference loader slices these tensors for expert TP
// through its strided loaders, infer/hf_experts.hpp.)
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
// above), and back.
void gpt_oss_expert_to_hf(const ExpertWeights& w, int64_t l,
                          const std::array<float*, kGptOssExpertTensors>& out);
void gpt_oss_expert_from_hf(const std::array<const float*, kGptOssExpertTensors>& in, ExpertWeights& w,
                            int64_t l);

}  // namespace expar
