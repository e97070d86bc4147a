#pragma once
// The nn tests' finite-difference gradient check of a scalar loss L = Σ r ⊙ y (a fixed random projection of
// a layer's output), with central differences (Richardson- extrapolated) and the loss accumulated in double.
// Random tensors and comparisons: tests/common/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "expar/core/tensor.hpp"

namespace expar::nn::testing {

// Σ r·y in double.
inline double project(const Tensor& r, const Tensor& y) {
  EXPECT_EQ(r.shape(), y.shape());
  double s = 0.0;
  const float* pr = r.data<float>();
  const float* py = y.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(pr[i]) * py[i];
  return s;
}

// Compares `analytic` (the gradient of loss() with respect to `values`) against central differences with
// step h, at every element. An element passes when |num - ana| <= rtol·max(|num|, |ana|, floor) where
// floor = 0.05·max|ana| over the tensor (tiny components are judged on the tensor's scale). Also requires
// the whole vector's relative error ‖num - ana‖/‖num‖ below rtol / 4.
inline void expect_gradient(const std::string& what, const std::function<double()>& loss, Tensor& values,
                            const Tensor& analytic, double h = 1e-2, double rtol = 1e-3) {
  ASSERT_EQ(values.shape(), analytic.shape()) << what;
  float* v = values.data<float>();
  const float* a = analytic.data<float>();
  double max_abs = 0.0;
  for (int64_t i = 0; i < analytic.numel(); ++i)
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(a[i])));
  ASSERT_GT(max_abs, 0.0) << what << ": the analytic gradient is all zero; the check would prove nothing";
  const double floor = 0.05 * max_abs;
  double diff_sq = 0.0, num_sq = 0.0;
  int failures = 0;
  for (int64_t i = 0; i < values.numel(); ++i) {
    // Central difference at step h and h/2, combined by Richardson extrapolation: the O(h²) error of the
    // two cancels, leaving O(h⁴), so a large step (little f32 rounding) still gives an accurate slope.
    auto central = [&](double step_size) {
      const float saved = v[i];
      v[i] = static_cast<float>(saved + step_size);
      const double up = loss();
      v[i] = static_cast<float>(saved - step_size);
      const double down = loss();
      v[i] = saved;
      // The step actually applied, in f32.
      const double step = static_cast<double>(static_cast<float>(saved + step_size)) -
                          static_cast<double>(static_cast<float>(saved - step_size));
      return (up - down) / step;
    };
    const double num = (4.0 * central(h / 2) - central(h)) / 3.0;
    const double ana = a[i];
    diff_sq += (num - ana) * (num - ana);
    num_sq += num * num;
    const double scale = std::max({std::fabs(num), std::fabs(ana), floor});
    if (std::fabs(num - ana) > rtol * scale && failures++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << ana << " vs numeric " << num;
  }
  EXPECT_EQ(failures, 0) << what << ": elements off";
  EXPECT_LT(std::sqrt(diff_sq / num_sq), rtol / 4) << what << ": relative error of the whole gradient";
}

}  // namespace expar::nn::testing
