#include "expar/nn/rmsnorm.hpp"

#include <cmath>

#include "expar/nn/check.hpp"

namespace expar::nn {

Tensor rmsnorm_forward(const Tensor& x, const Tensor& gain, float eps, RmsNormSaved* saved) {
  EXPAR_CHECK(eps > 0.0f && std::isfinite(eps),
              "rmsnorm_forward: eps={} must be a finite positive number: use 1e-5", eps);
  check_f32_matrix(x, "rmsnorm_forward", "x");
  const int64_t n = x.dim(0), d = x.dim(1);
  check_f32(gain, "rmsnorm_forward", "gain", {d});
  Tensor y = Tensor::empty({n, d});
  Tensor rstd = Tensor::empty({n});
  const float* px = x.data<float>();
  const float* g = gain.data<float>();
  float* py = y.data<float>();
  float* pr = rstd.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = px + i * d;
    double sum_sq = 0.0;  // double: the mean of d squares must not lose the small rows' precision
    for (int64_t j = 0; j < d; ++j) sum_sq += static_cast<double>(row[j]) * row[j];
    const float r = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(d) + eps));
    pr[i] = r;
    for (int64_t j = 0; j < d; ++j) py[i * d + j] = row[j] * r * g[j];
  }
  if (saved) {
    saved->x = x;
    saved->rstd = rstd;
  }
  return y;
}

Tensor rmsnorm_backward(const RmsNormSaved& saved, const Tensor& grad_y, const Tensor& gain,
                        Tensor& grad_gain) {
  check_f32_matrix(saved.x, "rmsnorm_backward", "saved.x");
  const int64_t n = saved.x.dim(0), d = saved.x.dim(1);
  check_f32(saved.rstd, "rmsnorm_backward", "saved.rstd", {n});
  check_f32(grad_y, "rmsnorm_backward", "grad_y", {n, d});
  check_f32(gain, "rmsnorm_backward", "gain", {d});
  check_f32(grad_gain, "rmsnorm_backward", "grad_gain", {d});
  Tensor grad_x = Tensor::empty({n, d});
  const float* px = saved.x.data<float>();
  const float* pr = saved.rstd.data<float>();
  const float* gy = grad_y.data<float>();
  const float* g = gain.data<float>();
  float* gx = grad_x.data<float>();
  float* gg = grad_gain.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* x = px + i * d;
    const float* dy = gy + i * d;
    const float r = pr[i];
    // y_j = x_j r g_j with r = (mean(x²)+eps)^-1/2, so dr/dx_j = -r³ x_j / d and
    // dx_j = r g_j dy_j - (r³ / d) x_j Σ_k g_k dy_k x_k.
    double dot = 0.0;
    for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(g[j]) * dy[j] * x[j];
    const float coef = static_cast<float>(dot * r * r * r / static_cast<double>(d));
    for (int64_t j = 0; j < d; ++j) {
      gx[i * d + j] = r * g[j] * dy[j] - coef * x[j];
      gg[j] += dy[j] * x[j] * r;
    }
  }
  return grad_x;
}

}  // namespace expar::nn
