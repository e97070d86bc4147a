#pragma once
// Cross-entropy of logits [N, V] against int32 targets [N], loss and gradient in one pass.
#include <cstdint>

#include "expar/core/tensor.hpp"

namespace expar::nn {

inline constexpr int32_t kIgnoreTarget = -1;  // a target of -1 contributes neither loss nor gradient

struct CrossEntropyResult {
  double loss = 0.0;      // sum of -log p(target) over counted rows, divided by the normalizer
  double loss_sum = 0.0;  // the undivided sum
  int64_t counted = 0;    // rows whose target is not kIgnoreTarget
  Tensor grad_logits;     // [N, V]: d loss / d logits (rows with an ignored target are zero)
};

// Numerically stable log-softmax. `normalizer` divides the summed loss and the gradient; -1 means the
// number of counted rows here (a plain mean). Data-parallel ranks pass the global counted total so that
// summing their gradients gives the gradient of the global mean. With nothing counted and normalizer -1,
// the loss is 0 and the gradient zero. Targets must be in [0, V) or kIgnoreTarget.
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t normalizer = -1);

}  // namespace expar::nn
