#include "expar/model/gpt_oss_layout.hpp"

#include "expar/core/error.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

std::array<std::string, kGptOssExpertTensors> gpt_oss_expert_names(int layer) {
  const WeightNames n = gpt_oss_weight_names();
  return {n.expert(layer, 0, "gate_up_proj"), n.expert(layer, 0, "gate_up_proj_bias"),
          n.expert(layer, 0, "down_proj"), n.expert(layer, 0, "down_proj_bias")};
}

Shape gpt_oss_expert_shape(GptOssExpertTensor which, int64_t d, int64_t h) {
  switch (which) {
    case kGateUp:
      return {d, 2 * h};
    case kGateUpBias:
      return {2 * h};
    case kDown:
      return {h, d};
    case kDownBias:
      return {d};
  }
  return {};
}

namespace {

void check_biased(const ExpertWeights& w) {
  EXPAR_CHECK(w.b1.defined() && w.b3.defined() && w.b2.defined(),
              "gpt-oss's expert layout needs the gate, up and down biases: build the MoE layer with "
              "expert_biases");
}

}  // namespace

void gpt_oss_expert_to_hf(const ExpertWeights& w, int64_t l,
                          const std::array<float*, kGptOssExpertTensors>& out) {
  check_biased(w);
  const int64_t h = w.hidden(), d = w.model();
  const float* w1 = w.w1.data<float>() + l * h * d;
  const float* w3 = w.w3.data<float>() + l * h * d;
  const float* w2 = w.w2.data<float>() + l * d * h;
  const float* b1 = w.b1.data<float>() + l * h;
  const float* b3 = w.b3.data<float>() + l * h;
  const float* b2 = w.b2.data<float>() + l * d;
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      out[kGateUp][c * 2 * h + 2 * i] = w1[i * d + c];
      out[kGateUp][c * 2 * h + 2 * i + 1] = w3[i * d + c];
      out[kDown][i * d + c] = w2[c * h + i];
    }
    out[kGateUpBias][2 * i] = b1[i];
    out[kGateUpBias][2 * i + 1] = b3[i];
  }
  for (int64_t c = 0; c < d; ++c) out[kDownBias][c] = b2[c];
}

}  // namespace expar
