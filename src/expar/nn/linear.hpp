#pragma once
// Linear layer y = x·Wᵀ (+ b), W stored [out, in] as PyTorch does, so checkpoints load without transposes.
#include "expar/core/tensor.hpp"

namespace expar::nn {

struct LinearSaved {
  // The input [N, in] as the weight gradient reads it (nn/linear_products.hpp's saved_operand): under f32
  // products the caller's tensor (shared storage), under BF16 products its BF16 rounding.
  Tensor x;
};

// x [N, in], weight [out, in], bias [out] or nullptr. Returns y [N, out]. `saved` may be nullptr
// (inference). With `weight_bf16` (the weight's BF16 copy; mixed-precision training) the products, here
// and in linear_backward, are BF16 products with f32 accumulation (nn/linear_products.hpp).
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, LinearSaved* saved,
                      const Tensor& weight_bf16 = Tensor{});

// Returns grad_x [N, in]; accumulates grad_weight [out, in] += grad_yᵀ·x and grad_bias [out] += Σ grad_y
// (grad_bias nullptr when there is no bias).
Tensor linear_backward(const LinearSaved& saved, const Tensor& grad_y, const Tensor& weight,
                       Tensor& grad_weight, Tensor* grad_bias, const Tensor& weight_bf16 = Tensor{});

}  // namespace expar::nn
