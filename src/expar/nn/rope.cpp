#include "expar/nn/rope.hpp"

#include <cmath>

#include "expar/nn/check.hpp"

namespace expar::nn {

Rope::Rope(int64_t head_dim, int64_t max_positions, double theta)
    : head_dim_(head_dim), max_positions_(max_positions), theta_(theta) {
  EXPAR_CHECK(head_dim > 0 && head_dim % 2 == 0,
              "Rope: head_dim={} must be positive and even (values rotate in pairs): choose an even head_dim",
              head_dim);
  EXPAR_CHECK(max_positions > 0, "Rope: max_positions={} must be positive: pass the longest sequence length",
              max_positions);
  EXPAR_CHECK(std::isfinite(theta) && theta > 1.0,
              "Rope: theta={} must be finite and above 1: the usual is 10000", theta);
  const int64_t half = head_dim / 2;
  cos_.resize(static_cast<size_t>(max_positions * half));
  sin_.resize(cos_.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (int64_t p = 0; p < max_positions; ++p) {
      // The angle in double: at position 10^4 an f32 product would already be off by ~1e-3 rad.
      const double angle = static_cast<double>(p) * inv_freq;
      cos_[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      sin_[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
  }
}

void Rope::apply(float* x, int64_t rows, int64_t n_heads, int64_t ld, const int32_t* positions,
                 bool inverse) const {
  EXPAR_CHECK(n_heads >= 0 && ld >= n_heads * head_dim_,
              "Rope::apply: n_heads={} with head_dim={} needs a row stride of at least {}, got ld={}",
              n_heads, head_dim_, n_heads * head_dim_, ld);
  const int64_t half = head_dim_ / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t pos = positions[r];
    EXPAR_CHECK(pos >= 0 && pos < max_positions_,
                "Rope: position {} of row {} is outside [0, {}): build the Rope with a larger max_positions",
                pos, r, max_positions_);
    const float* c = cos_.data() + static_cast<int64_t>(pos) * half;
    const float* s = sin_.data() + static_cast<int64_t>(pos) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + r * ld + h * head_dim_;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half], sn = sign * s[i];
        v[i] = a * c[i] - b * sn;
        v[i + half] = b * c[i] + a * sn;
      }
    }
  }
}

void Rope::forward(Tensor& x, int64_t n_heads, const Tensor& positions) const {
  const int64_t n = x.ndim() >= 1 ? x.dim(0) : 0;
  check_f32(x, "Rope::forward", "x", {n, n_heads * head_dim_});
  check_i32(positions, "Rope::forward", "positions", n);
  apply(x.data<float>(), n, n_heads, n_heads * head_dim_, positions.data<int32_t>(), false);
}

void Rope::backward(Tensor& grad_x, int64_t n_heads, const Tensor& positions) const {
  const int64_t n = grad_x.ndim() >= 1 ? grad_x.dim(0) : 0;
  check_f32(grad_x, "Rope::backward", "grad_x", {n, n_heads * head_dim_});
  check_i32(positions, "Rope::backward", "positions", n);
  apply(grad_x.data<float>(), n, n_heads, n_heads * head_dim_, positions.data<int32_t>(), true);
}

}  // namespace expar::nn
