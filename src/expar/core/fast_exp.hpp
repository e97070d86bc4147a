#pragma once
// A vectorisable single-precision exp for elementwise loops (SwiGLU's sigmoid).
//
// Why: GCC vectorises a loop calling std::exp only under -ffast-math (glibc's SIMD variants are declared only
// then), so the SwiGLU loops of the expert MLP ran scalar libm exp, one element per call, a visible share of
// a grouped-GEMM step (docs/performance_history.md, "Fresh pages"). This inline version has no calls, no
// branches and no integer conversion of a float, so `#pragma omp simd` loops vectorise (AVX-512: 16 lanes).
//
// Accuracy: within 2 ulp of the correctly rounded exp on [-87.3, 88] (tests/core/fast_exp_test.cpp checks
// every float in that range). Outside it the argument is clamped: exp(x > 88) = exp(88) (finite, so
// 1 / (1 + exp(-x)) never sees inf·0), exp(x < -87.3) = exp(-87.3) (the smallest normal range); NaN stays
// NaN. Cody-Waite reduction x = n·ln2 + r, |r| <= ln2/2, then a degree-6 polynomial (Cephes expf).
#include <bit>
#include <cmath>
#include <cstdint>

namespace expar {

inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick: the sum's low mantissa bits hold n.
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - 0x4B400000;
  float r = std::fma(n, -0.693145751953125f, x);  // ln2 split in two so n·ln2_hi is exact
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  return p * std::bit_cast<float>((n_int + 127) << 23);
}

// 1 / (1 + e^-x).
inline float fast_sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

}  // namespace expar
