#pragma once
// The check of a BF16 product with f32 accumulation against the f64 reference of its own BF16 operands
// (tests/core/matmul_bf16_test.cpp explains the bound): the operands' products are exact in f32, so the only
// error is the f32 summation of t terms, |c − exact| ≤ γ_t·Σ|terms| with γ_t = t·u/(1 − t·u), u = 2^-24
// (Higham, Accuracy and Stability, 3.1), plus 2^-126 for the flush of a denormal partial sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace expar::test {

inline double summation_gamma(int64_t terms) {
  const double u = std::ldexp(1.0, -24);
  return double(terms) * u / (1.0 - double(terms) * u);
}

// A reference element: the exact sum and the sum of its terms' magnitudes.
struct ExactSum {
  double value = 0.0, magnitude = 0.0;
  void add(double a, double b) {
    value += a * b;
    magnitude += std::fabs(a * b);
  }
};

// Checks got[i·ld + j] (i < rows, j < cols) against exact(i, j) (an ExactSum) within γ_terms; reports the
// first five elements out of bounds.
template <typename Exact>
void expect_within_bound(const float* got, int64_t ld, int64_t rows, int64_t cols, int64_t terms, Exact exact,
                         const char* what) {
  int bad = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const ExactSum e = exact(i, j);
      const double bound = summation_gamma(terms) * e.magnitude + 0x1p-126;
      const double g = got[i * ld + j];
      if (!(std::fabs(g - e.value) <= bound) && ++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "," << j << "] = " << g << ", f64 reference " << e.value
                      << ", error " << std::fabs(g - e.value) << " > bound " << bound;
    }
}

}  // namespace expar::test
