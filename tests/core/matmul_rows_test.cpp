// Batch-invariant matmuls (core/matmul.hpp): with the minimum row count set, row i of a product is the same
// bits whatever the number of rows in the call, for every m from 1 to 40, plain and accumulating, with a
// leading dimension wider than k; and it is off by default and per thread.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"

namespace expar {
namespace {

std::vector<float> random_vector(size_t n, uint64_t stream) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = random_normal(3, stream, i);
  return v;
}

TEST(MatmulRows, RowsDoNotDependOnTheirBatch) {
  const int64_t n = 96, k = 80, lda = 88, rows = 40;
  const std::vector<float> a = random_vector(static_cast<size_t>(rows * lda), 1);
  const std::vector<float> w = random_vector(static_cast<size_t>(n * k), 2);
  const std::vector<float> c0 = random_vector(static_cast<size_t>(rows * n), 3);
  set_matmul_min_rows(kBatchInvariantRows);
  for (bool accumulate : {false, true}) {
    auto product = [&](int64_t m) {
      std::vector<float> c(c0.begin(), c0.begin() + m * n);
      MatmulArgs p;
      p.a = a.data();
      p.b = w.data();
      p.c = c.data();
      p.m = m;
      p.n = n;
      p.k = k;
      p.lda = lda;
      p.trans_b = true;
      p.accumulate = accumulate;
      matmul(p);
      return c;
    };
    const std::vector<float> all = product(rows);
    for (int64_t m = 1; m < rows; ++m) {
      const std::vector<float> part = product(m);
      EXPECT_EQ(std::memcmp(part.data(), all.data(), sizeof(float) * static_cast<size_t>(m * n)), 0)
          << "m=" << m << " accumulate=" << accumulate;
    }
    // The padded path computes the same product as the plain one (within rounding).
    set_matmul_min_rows(0);
    const std::vector<float> plain = product(3);
    set_matmul_min_rows(kBatchInvariantRows);
    const std::vector<float> padded = product(3);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_NEAR(padded[i], plain[i], 1e-4f * (1.0f + std::abs(plain[i])));
  }
  set_matmul_min_rows(0);
}

TEST(MatmulRows, OffByDefaultAndPerThread) {
  EXPECT_EQ(matmul_min_rows(), 0);
  set_matmul_min_rows(16);
  int64_t other = -1;
  std::thread([&] { other = matmul_min_rows(); }).join();
  EXPECT_EQ(other, 0);
  EXPECT_EQ(matmul_min_rows(), 16);
  set_matmul_min_rows(0);
  EXPECT_THROW(set_matmul_min_rows(-1), Error);
}

}  // namespace
}  // namespace expar
