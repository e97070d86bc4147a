#pragma once
// A trainable parameter: its value, its gradient, and which replica group it belongs to. Dense parameters
// (attention, norms, embeddings, router, shared experts) are replicated over the dense data-parallel group;
// routed-expert parameters are sharded over EP_MP and replicated over EP_DP (seed 000 §5.1).
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar {

enum class ParamKind : uint8_t { Dense, Expert };

struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;
  ParamKind kind = ParamKind::Dense;
  bool weight_decay = true;  // norms' gains and biases are usually exempt
  // Per entry of the first dimension: whether its gradient counts in the global gradient norm. Empty: every
  // entry. An expert tensor with redundant slots counts each logical expert's first slot only, since its
  // replicas hold the same summed gradient.
  std::vector<bool> norm_rows;
  // Mixed precision (`expar train --precision bf16`): the BF16 copy of `value` that the products read
  // (undefined: none), refreshed by the optimizer in the pass that updates `value` (train/adamw.hpp).
  Tensor bf16_copy;
};

// Allocates value (category by kind) and a zeroed gradient of the same shape.
inline Parameter make_parameter(std::string name, Shape shape, ParamKind kind, bool weight_decay = true) {
  Parameter p;
  p.name = std::move(name);
  p.kind = kind;
  p.weight_decay = weight_decay;
  p.value = Tensor::zeros(shape, DType::F32,
                          kind == ParamKind::Expert ? MemCategory::ExpertWeights : MemCategory::DenseWeights);
  p.grad = Tensor::zeros(shape, DType::F32, MemCategory::Gradients);
  return p;
}

}  // namespace expar
