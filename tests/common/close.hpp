#pragma once
// Comparing results with their references, one rule for every test. A Tolerance says how far an element may
// be from its reference, and whether that allowance is relative to the element, to the tensor's largest
// element, or partly absolute; a test names the kind it means (numerical results are compared at f32
// rounding of different summation orders: the kind decides what "f32 rounding" is measured against).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar::test {

// |got - want| <= abs + rel * max(|want|, floor), and with `floor_is_largest` also at least rel times the
// largest |want| of the whole comparison (every element judged on the tensor's scale).
struct Tolerance {
  double rel = 0.0;
  double floor = 0.0;
  double abs = 0.0;
  bool floor_is_largest = false;

  // rel * max(|want|, floor): relative, and absolute rel * floor for elements below `floor` in magnitude.
  static Tolerance relative(double rel, double floor = 0.0) { return {rel, floor, 0.0, false}; }
  // rel * max |want| over the comparison: small elements are judged on the scale of the largest one.
  static Tolerance relative_to_largest(double rel) { return {rel, 0.0, 0.0, true}; }
  // abs + rel * |want|.
  static Tolerance abs_plus_rel(double abs, double rel) { return {rel, 0.0, abs, false}; }

  // The allowed |got - want| for one element; `largest` is max |want| over the comparison.
  double bound(double want, double largest) const {
    return abs + rel * std::max({std::fabs(want), floor, floor_is_largest ? largest : 0.0});
  }
};

// got within tol of want, element by element; on failure: how many elements are off, the worst (by its
// distance over its allowance) and the first few.
inline ::testing::AssertionResult close(std::span<const float> got, std::span<const float> want,
                                        const Tolerance& tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements against " << want.size();
  double largest = 0.0;
  for (float w : want) largest = std::max(largest, std::fabs(static_cast<double>(w)));
  size_t off = 0, worst = 0;
  double worst_ratio = 0.0;
  ::testing::Message first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i], bound = tol.bound(w, largest);
    const double diff = std::fabs(g - w);
    if (diff <= bound) continue;  // NaN in either fails here
    if (off < 5) first << " [" << i << "] " << g << " vs " << w << ";";
    const double ratio = bound > 0.0 ? diff / bound : HUGE_VAL;
    if (off == 0 || !(ratio <= worst_ratio)) {
      worst = i;
      worst_ratio = ratio;
    }
    ++off;
  }
  if (off == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << off << " of " << got.size() << " elements off; worst at element " << worst << ": " << got[worst]
         << " vs " << want[worst] << ", |diff| " << std::fabs(static_cast<double>(got[worst]) - want[worst])
         << " > allowed " << tol.bound(want[worst], largest) << " (max |want| " << largest
         << "); first:" << first;
}

inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                        const Tolerance& tol) {
  return close(std::span<const float>(got), std::span<const float>(want), tol);
}

// Two f32 tensors of one shape.
inline ::testing::AssertionResult close(const Tensor& got, const Tensor& want, const Tolerance& tol) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_string(got.shape()) << " vs " << shape_string(want.shape());
  if (got.dtype() != DType::F32 || want.dtype() != DType::F32)
    return ::testing::AssertionFailure() << "compares f32 tensors only";
  return close(std::span<const float>(got.data<float>(), static_cast<size_t>(got.numel())),
               std::span<const float>(want.data<float>(), static_cast<size_t>(want.numel())), tol);
}

// One value (floor_is_largest: its own magnitude).
inline ::testing::AssertionResult close(double got, double want, const Tolerance& tol) {
  const double diff = std::fabs(got - want), bound = tol.bound(want, std::fabs(want));
  if (diff <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << got << " vs " << want << ": |diff| " << diff << " > allowed " << bound;
}

// max |a - b| over two f32 tensors of one shape (for a test that states an absolute bound, or that two
// results differ).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0.0;
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(pa[i]) - pb[i]));
  return m;
}

}  // namespace expar::test
