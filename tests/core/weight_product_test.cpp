// core/weight_product: y = x · wᵀ with w as stored. Where the build has the fused kernel, every element must
// be exactly the chain of fused multiply-adds over k in order that the header promises (computed here with
// std::fma, element by element), at shapes with every edge: rows below, at and past a tile, a ragged last
// panel, k below a vector, at and past a block of k, row strides wider than the rows; with y poisoned (it is
// never read) and the same bits from the AVX2 kernel, at 1 and 2 compute threads, and for a row computed alone
// or among others. Without the fused kernel (oneDNN), within float rounding of a double-precision sum.
#include "expar/core/weight_product.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/random_vector.hpp"
#include "expar/core/matmul.hpp"

namespace expar {
namespace {

struct Shape {
  int64_t m, n, k, ldx, ldw, ldy;
};

struct Operands {
  std::vector<float> x, w;
  Operands(const Shape& s, uint64_t seed)
      : x(random_vector(static_cast<size_t>(s.m * s.ldx), seed, 1)),
        w(random_vector(static_cast<size_t>(s.n * s.ldw), seed, 2)) {}
};

std::vector<float> poisoned(const Shape& s) {
  return std::vector<float>(static_cast<size_t>(std::max<int64_t>(s.m * s.ldy, 1)),
                            std::numeric_limits<float>::quiet_NaN());
}

using Kernel = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t);

std::vector<float> run(Kernel kernel, const Shape& s, const Operands& o) {
  std::vector<float> y = poisoned(s);
  kernel(o.x.data(), s.ldx, o.w.data(), s.ldw, y.data(), s.ldy, s.m, s.n, s.k);
  return y;
}

// Compares rows [0, m) x columns [0, n) of y with the fused chain (or, without the fused kernel, with a
// double-precision sum), and checks that the padding past n was left alone (still NaN).
void expect_product(const std::vector<float>& y, const Shape& s, const Operands& o, const char* what) {
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const float* xr = o.x.data() + i * s.ldx;
      const float* wr = o.w.data() + j * s.ldw;
      const float got = y[static_cast<size_t>(i * s.ldy + j)];
      if (weight_product_fused()) {
        float chain = 0.0f;
        for (int64_t kk = 0; kk < s.k; ++kk) chain = std::fma(xr[kk], wr[kk], chain);
        ASSERT_EQ(got, chain) << what << ": y[" << i << "][" << j << "] of m " << s.m << " n " << s.n << " k "
                              << s.k << " is not the fused chain over k";
      } else {
        double sum = 0.0, magnitude = 0.0;
        for (int64_t kk = 0; kk < s.k; ++kk) {
          sum += static_cast<double>(xr[kk]) * wr[kk];
          magnitude += std::fabs(static_cast<double>(xr[kk]) * wr[kk]);
        }
        ASSERT_NEAR(got, sum, 1e-5 * magnitude + 1e-30) << what << ": y[" << i << "][" << j << "]";
      }
    }
    for (int64_t j = s.n; j < s.ldy && i * s.ldy + j < static_cast<int64_t>(y.size()); ++j)
      ASSERT_TRUE(std::isnan(y[static_cast<size_t>(i * s.ldy + j)]))
          << what << ": wrote past n at row " << i << " column " << j;
  }
}

const std::vector<Shape> kShapes = {
    {1, 1, 1, 1, 1, 1},          {5, 7, 15, 15, 15, 9},        {12, 32, 16, 16, 16, 32},
    {13, 33, 17, 20, 19, 40},    {11, 16, 512, 512, 512, 16},  {25, 100, 513, 520, 530, 104},
    {130, 64, 1100, 1100, 1104, 80}, {7, 48, 40, 40, 40, 48},  {64, 256, 512, 512, 512, 272},
};

TEST(WeightProduct, EveryElementIsTheFusedChainOverK) {
  for (const Shape& s : kShapes) {
    const Operands o(s, 11);
    expect_product(run(weight_product, s, o), s, o, "native kernel");
  }
}

TEST(WeightProduct, TheAvx2KernelGivesTheSameBits) {
  for (const Shape& s : kShapes) {
    const Operands o(s, 12);
    const std::vector<float> native = run(weight_product, s, o), avx2 = run(weight_product_avx2_for_tests, s, o);
    expect_product(avx2, s, o, "AVX2 kernel");
    for (size_t i = 0; i < native.size(); ++i) {
      if (std::isnan(native[i])) continue;  // padding past n, checked by expect_product
      ASSERT_EQ(native[i], avx2[i]) << "element " << i << " of m " << s.m << " n " << s.n;
    }
  }
}

TEST(WeightProduct, TheThreadCountNeverChangesBits) {
  const int saved = compute_threads();
  const Shape s{64, 256, 512, 512, 512, 256};  // 8 Mi multiply-adds and 8 panels: spread over the threads
  const Operands o(s, 13);
  std::vector<float> by_threads[2];
  for (const int threads : {1, 2}) {
    set_compute_threads(threads);
    by_threads[threads - 1] = run(weight_product, s, o);
  }
  set_compute_threads(saved);
  expect_product(by_threads[1], s, o, "two threads");
  EXPECT_EQ(by_threads[0], by_threads[1]);
}

TEST(WeightProduct, ARowDoesNotDependOnItsBatch) {
  if (!weight_product_fused()) GTEST_SKIP() << "oneDNN's bits depend on the row count (core/matmul.hpp)";
  const Shape batch{130, 96, 700, 700, 700, 96};
  const Operands o(batch, 14);
  const std::vector<float> all = run(weight_product, batch, o);
  for (const int64_t row : {0, 11, 12, 127, 129}) {
    std::vector<float> alone(static_cast<size_t>(batch.n));
    weight_product(o.x.data() + row * batch.ldx, batch.ldx, o.w.data(), batch.ldw, alone.data(), batch.n, 1,
                   batch.n, batch.k);
    for (int64_t j = 0; j < batch.n; ++j)
      ASSERT_EQ(alone[static_cast<size_t>(j)], all[static_cast<size_t>(row * batch.ldy + j)])
          << "row " << row << " column " << j;
  }
}

TEST(WeightProduct, AnEmptySumIsZeroAndNoRowsWriteNothing) {
  const Shape s{3, 5, 0, 1, 1, 6};
  const Operands o(s, 15);
  const std::vector<float> y = run(weight_product, s, o);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) EXPECT_EQ(y[static_cast<size_t>(i * s.ldy + j)], 0.0f);
  std::vector<float> untouched(4, 7.0f);
  weight_product(o.x.data(), 1, o.w.data(), 1, untouched.data(), 4, 0, 4, 1);
  EXPECT_EQ(untouched, std::vector<float>(4, 7.0f));
}

}  // namespace
}  // namespace expar
