#pragma once
// Qwen-MoE's shared-expert gate (mlp.shared_expert_gate.weight, w [1, d]): token t's shared-expert output
// y_t enters the layer's output scaled by s_t = sigmoid(x_t · w). One implementation for the training model
// (with its backward) and the inference engine; with TP, scaling each rank's partial y by s_t scales the sum.
#include <cstdint>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar {

// s_t for every row of x [T, d] (the dot product in double).
std::vector<float> shared_expert_gate(const Tensor& x, const Tensor& w);

// out [T, d] += s_t · y_t, y [T, d] row-major.
void add_gated_rows(std::span<const float> s, const float* y, int64_t rows, int64_t d, float* out);

// The backward of out += s · y(x) for the gate: returns grad_y = s_t · grad_out_t [T, d], and ADDS
// dz_t · x_t into grad_w [1, d] and dz_t · w into grad_x [T, d], with dz_t = s_t (1 − s_t) (grad_out_t ·
// y_t).
Tensor shared_expert_gate_backward(const Tensor& grad_out, const Tensor& y, const Tensor& x, const Tensor& w,
                                   std::span<const float> s, Tensor& grad_w, Tensor& grad_x);

}  // namespace expar
