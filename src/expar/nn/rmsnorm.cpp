#include "expar/nn/rmsnorm.hpp"

#include <algorithm>
#include <cmath>

#include "expar/nn/check.hpp"

namespace expar::nn {

namespace {

// Each row's reduction is one sequential chain of double additions in column order, whose every addition
// waits on the one before: row after row, the norms ran at that latency (a visible share of a training step).
// So kRowBlock rows are reduced at once, their chains interleaved so that their latencies overlap; each
// chain still adds the same terms in the same order, so a row's bits are those of the row reduced alone.
constexpr int64_t kRowBlock = 8;

// sums[k] = Σ_j term(k, j) over the columns j < d in order, for the `rows` rows k < rows ≤ kRowBlock.
template <int64_t Rows, typename Term>
void row_sums_of(int64_t d, double* sums, Term term) {
  double s[Rows] = {};
  for (int64_t j = 0; j < d; ++j)
    for (int64_t k = 0; k < Rows; ++k) s[k] += term(k, j);
  for (int64_t k = 0; k < Rows; ++k) sums[k] = s[k];
}

template <typename Term>
void row_sums(int64_t rows, int64_t d, double* sums, Term term) {
  if (rows == kRowBlock) return row_sums_of<kRowBlock>(d, sums, term);
  for (int64_t k = 0; k < rows; ++k)
    row_sums_of<1>(d, sums + k, [&](int64_t, int64_t j) { return term(k, j); });
}

}  // namespace

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
  for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - i0);
    double sum_sq[kRowBlock];  // double: the mean of d squares must not lose the small rows' precision
    const float* block = px + i0 * d;
    row_sums(rows, d, sum_sq, [&](int64_t k, int64_t j) {
      const float v = block[k * d + j];
      return static_cast<double>(v) * v;
    });
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t i = i0 + k;
      const float* row = px + i * d;
      const float r = static_cast<float>(1.0 / std::sqrt(sum_sq[k] / static_cast<double>(d) + eps));
      pr[i] = r;
      for (int64_t j = 0; j < d; ++j) py[i * d + j] = row[j] * r * g[j];
    }
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
  for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - i0);
    // y_j = x_j r g_j with r = (mean(x²)+eps)^-1/2, so dr/dx_j = -r³ x_j / d and
    // dx_j = r g_j dy_j - (r³ / d) x_j Σ_k g_k dy_k x_k.
    double dots[kRowBlock];
    const float* x_block = px + i0 * d;
    const float* dy_block = gy + i0 * d;
    row_sums(rows, d, dots, [&](int64_t k, int64_t j) {
      return static_cast<double>(g[j]) * dy_block[k * d + j] * x_block[k * d + j];
    });
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t i = i0 + k;
      const float* x = px + i * d;
      const float* dy = gy + i * d;
      const float r = pr[i];
      const float coef = static_cast<float>(dots[k] * r * r * r / static_cast<double>(d));
      for (int64_t j = 0; j < d; ++j) {
        gx[i * d + j] = r * g[j] * dy[j] - coef * x[j];
        gg[j] += dy[j] * x[j] * r;
      }
    }
  }
  return grad_x;
}

}  // namespace expar::nn
