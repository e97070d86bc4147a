#pragma once
// Expert weights for the expert MLP's tests (moe/expert_mlp.hpp).
#include <cstdint>

#include "expar/core/rng.hpp"
#include "expar/moe/expert_mlp.hpp"

namespace expar::testing {

// `experts` local experts of model dim d and intermediate h: w1, w3, w2 ~ N(0, 0.1²) from `seed`'s streams
// 1-3; with gpt_oss also the gate, up and down biases ~ N(0, 0.5²) (streams 4-6) and the clamped activation.
inline ExpertWeights random_experts(int64_t experts, int64_t d, int64_t h, bool gpt_oss, uint64_t seed) {
  ExpertWeights w{Tensor::empty({experts, h, d}), Tensor::empty({experts, h, d}),
                  Tensor::empty({experts, d, h})};
  fill_normal(w.w1, seed, 1, 0.1f);
  fill_normal(w.w3, seed, 2, 0.1f);
  fill_normal(w.w2, seed, 3, 0.1f);
  if (gpt_oss) {
    w.b1 = Tensor::empty({experts, h});
    w.b3 = Tensor::empty({experts, h});
    w.b2 = Tensor::empty({experts, d});
    fill_normal(w.b1, seed, 4, 0.5f);
    fill_normal(w.b3, seed, 5, 0.5f);
    fill_normal(w.b2, seed, 6, 0.5f);
    w.activation = ExpertMlpActivation::GptOssClamped;
  }
  return w;
}

// Zero tensors shaped like each tensor w holds (undefined where w's is), the same activation: gradients.
inline ExpertWeights zeros_like(const ExpertWeights& w) {
  auto zeros = [](const Tensor& t) { return t.defined() ? Tensor::zeros(t.shape()) : Tensor(); };
  ExpertWeights g{zeros(w.w1), zeros(w.w3), zeros(w.w2), zeros(w.b1), zeros(w.b3), zeros(w.b2)};
  g.activation = w.activation;
  return g;
}

}  // namespace expar::testing
