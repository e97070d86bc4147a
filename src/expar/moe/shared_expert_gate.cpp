#include "expar/moe/shared_expert_gate.hpp"

#include <cmath>

#include "expar/core/error.hpp"

namespace expar {

std::vector<float> shared_expert_gate(const Tensor& x, const Tensor& w) {
  const int64_t rows = x.dim(0), d = x.dim(1);
  EXPAR_CHECK(w.numel() == d, "the shared-expert gate has {} weights but the rows have {} values", w.numel(),
              d);
  std::vector<float> s(static_cast<size_t>(rows));
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    double dot = 0.0;
    for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(px[t * d + j]) * pw[j];
    s[static_cast<size_t>(t)] = 1.0f / (1.0f + std::exp(-static_cast<float>(dot)));
  }
  return s;
}

void add_gated_rows(std::span<const float> s, const float* y, int64_t rows, int64_t d, float* out) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < d; ++j) out[t * d + j] += s[static_cast<size_t>(t)] * y[t * d + j];
}

Tensor shared_expert_gate_backward(const Tensor& grad_out, const Tensor& y, const Tensor& x, const Tensor& w,
                                   std::span<const float> s, Tensor& grad_w, Tensor& grad_x) {
  const int64_t rows = grad_out.dim(0), d = grad_out.dim(1);
  Tensor grad_y = Tensor::empty(grad_out.shape());
  const float* pg = grad_out.data<float>();
  const float* py = y.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* gy = grad_y.data<float>();
  float* gw = grad_w.data<float>();
  float* gx = grad_x.data<float>();
  for (int64_t t = 0; t < rows; ++t) {
    const float st = s[static_cast<size_t>(t)];
    double dot = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      gy[t * d + j] = st * pg[t * d + j];
      dot += static_cast<double>(pg[t * d + j]) * py[t * d + j];
    }
    const auto dz = static_cast<float>(dot * st * (1.0 - st));
    for (int64_t j = 0; j < d; ++j) {
      gw[j] += dz * px[t * d + j];
      gx[t * d + j] += dz * pw[j];
    }
  }
  return grad_y;
}

}  // namespace expar
