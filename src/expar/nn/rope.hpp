#pragma once
// Rotary position embeddings (RoPE) in the GPT-NeoX / LLaMA "rotate half" convention: within each head of
// head_dim = 2h values, element i (i < h) and element i + h form a pair rotated by the angle
// position · theta^(-2i / head_dim):
//   x'[i]     = x[i] cos - x[i+h] sin
//   x'[i + h] = x[i+h] cos + x[i] sin
// This is the layout Hugging Face LLaMA, Mixtral and Qwen-MoE checkpoints use, so their q/k projection
// weights load without a permutation. The backward pass is the rotation by the negative angle (the
// rotation is orthogonal, its adjoint is its inverse).
#include <cstdint>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar::nn {

class Rope {
 public:
  // Precomputes cos/sin for positions [0, max_positions). head_dim must be even, theta > 1.
  Rope(int64_t head_dim, int64_t max_positions, double theta = 10000.0);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  double theta() const { return theta_; }

  // Rotates in place `rows` rows of x, each holding n_heads heads of head_dim values starting at x + r·ld
  // (ld >= n_heads·head_dim); row r is at position positions[r]. inverse = true rotates by the negative
  // angle (the backward pass). Positions outside [0, max_positions) throw.
  void apply(float* x, int64_t rows, int64_t n_heads, int64_t ld, const int32_t* positions,
             bool inverse) const;

  // Tensor forms: x [N, n_heads·head_dim] f32, positions int32 [N].
  void forward(Tensor& x, int64_t n_heads, const Tensor& positions) const;
  void backward(Tensor& grad_x, int64_t n_heads, const Tensor& positions) const;

 private:
  int64_t head_dim_;
  int64_t max_positions_;
  double theta_;
  std::vector<float> cos_;  // [max_positions, head_dim / 2]
  std::vector<float> sin_;
};

}  // namespace expar::nn
