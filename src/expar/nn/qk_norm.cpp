#include "expar/nn/qk_norm.hpp"

#include <cmath>
#include <vector>

namespace expar::nn {

namespace {

// y[r, g·group + i] *= gain[(g·group + i) % gain_n] / sqrt(ss[r·groups + g] / count + eps): the RMSNorm of
// `groups` groups of `group` values per row of y [rows, groups·group], given the sums of squares ss.
void scale_by_rms(float* y, int64_t rows, int64_t groups, int64_t group, const float* ss, double count,
                  const float* gain, int64_t gain_n, float eps) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const auto inv =
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss[r * groups + g]) / count + eps));
      float* v = y + (r * groups + g) * group;
      for (int64_t i = 0; i < group; ++i) v[i] = v[i] * inv * gain[(g * group + i) % gain_n];
    }
}

// Sum of squares of each group of `group` values: ss [rows·groups].
std::vector<float> sums_of_squares(const float* y, int64_t rows, int64_t groups, int64_t group) {
  std::vector<float> ss(static_cast<size_t>(rows * groups));
  for (int64_t i = 0; i < rows * groups; ++i) {
    double acc = 0.0;
    for (int64_t j = 0; j < group; ++j) acc += static_cast<double>(y[i * group + j]) * y[i * group + j];
    ss[static_cast<size_t>(i)] = static_cast<float>(acc);
  }
  return ss;
}

}  // namespace

void apply_qk_norm(const AttentionShape& shape, const AttentionOptions& o, float* q, float* k, int64_t rows) {
  const int64_t hd = shape.head_dim, qd = shape.n_heads * hd, kd = shape.n_kv_heads * hd;
  if (o.qk_norm == QkNorm::PerHead) {
    auto qs = sums_of_squares(q, rows, shape.n_heads, hd),
         ks = sums_of_squares(k, rows, shape.n_kv_heads, hd);
    scale_by_rms(q, rows, shape.n_heads, hd, qs.data(), static_cast<double>(hd), o.q_norm.data<float>(), hd,
                 o.qk_norm_eps);
    scale_by_rms(k, rows, shape.n_kv_heads, hd, ks.data(), static_cast<double>(hd), o.k_norm.data<float>(),
                 hd, o.qk_norm_eps);
  } else if (o.qk_norm == QkNorm::Projection) {
    auto qs = sums_of_squares(q, rows, 1, qd), ks = sums_of_squares(k, rows, 1, kd);
    double q_count = static_cast<double>(qd), k_count = static_cast<double>(kd);
    if (o.sum_squares) {
      o.sum_squares(qs.data(), ks.data(), rows);
      q_count = static_cast<double>(o.q_norm_total);
      k_count = static_cast<double>(o.k_norm_total);
    }
    scale_by_rms(q, rows, 1, qd, qs.data(), q_count, o.q_norm.data<float>(), qd, o.qk_norm_eps);
    scale_by_rms(k, rows, 1, kd, ks.data(), k_count, o.k_norm.data<float>(), kd, o.qk_norm_eps);
  }
}

}  // namespace expar::nn
