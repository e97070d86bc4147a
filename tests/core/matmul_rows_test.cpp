// Batch-invariant matmuls (core/matmul.hpp): with the row quantum set, a row of a product is the same bits
// whatever the rest of its call: at every batch size and position tried (below, at and above the quantum,
// the tails of AVX2's 6-row kernel, the block boundary, and past the ~270 rows where AVX2's sgemm changes
// its blocking), plain and accumulating, with a leading dimension wider than k, at 1 and 2 compute threads.
// ctest runs it again with oneDNN capped at AVX2 (core_matmul_rows_test_avx2), where the quantum is 24: the
// rule is checked on both kernel families whatever the machine. Off by default and per thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "core/random_vector.hpp"
#include "expar/core/matmul.hpp"

namespace expar {
namespace {

struct Shape {
  int64_t n, k;
};

TEST(MatmulRows, RowsDoNotDependOnTheirBatch) {
  const int64_t q = batch_invariant_rows(), block = kBatchInvariantBlocks * q;
  const int saved_threads = compute_threads();
  for (const Shape s : {Shape{96, 80}, Shape{1024, 512}, Shape{512, 1024}}) {
    const int64_t n = s.n, k = s.k, lda = k + 8, total = 2 * block + q + 5;
    const std::vector<float> a = random_vector(static_cast<size_t>(total * lda), 3, 1);
    const std::vector<float> w = random_vector(static_cast<size_t>(n * k), 3, 2);
    const std::vector<float> c0 = random_vector(static_cast<size_t>(total * n), 3, 3);
    set_matmul_min_rows(q);
    for (const int threads : {1, 2}) {
      set_compute_threads(threads);
      for (const bool accumulate : {false, true}) {
        // Rows [first, first + m) of A as one product: a batch of m rows in which these sit from position 0.
        auto product = [&](int64_t first, int64_t m) {
          std::vector<float> c(c0.begin() + first * n, c0.begin() + (first + m) * n);
          const MatmulArgs p{.a = a.data() + first * lda,
                             .b = w.data(),
                             .c = c.data(),
                             .m = m,
                             .n = n,
                             .k = k,
                             .trans_b = true,
                             .accumulate = accumulate,
                             .lda = lda};
          matmul(p);
          return c;
        };
        const std::vector<float> all = product(0, total);
        for (const int64_t first : {int64_t{0}, int64_t{5}, q + 1})
          for (const int64_t m :
               {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{7}, q - 1, q, q + 1, int64_t{25},
                int64_t{47}, int64_t{100}, block - 1, block, block + 1, total - first}) {
            if (first + m > total) continue;
            const std::vector<float> part = product(first, m);
            EXPECT_EQ(
                std::memcmp(part.data(), all.data() + first * n, sizeof(float) * static_cast<size_t>(m * n)),
                0)
                << "n=" << n << " k=" << k << " rows [" << first << ", " << first + m << ") of " << total
                << ", quantum " << q << ", " << threads << " thread(s), accumulate=" << accumulate;
          }
        // The blocked and padded calls compute the same product as a plain one (within rounding).
        set_matmul_min_rows(0);
        const std::vector<float> plain = product(0, total);
        set_matmul_min_rows(q);
        for (size_t i = 0; i < plain.size(); ++i)
          ASSERT_NEAR(all[i], plain[i], 1e-4f * (1.0f + std::abs(plain[i]))) << "element " << i;
      }
    }
  }
  set_compute_threads(saved_threads);
  set_matmul_min_rows(0);
}

// Without the rule the rows of a product do depend on their batch on this machine's kernels (what makes it
// necessary), for some m the test above covers: AVX-512 at m < 16, AVX2 at rows in the 6-row kernel's tail.
TEST(MatmulRows, PlainProductsDependOnTheirBatch) {
  const int64_t n = 96, k = 80, total = 40;
  const std::vector<float> a = random_vector(static_cast<size_t>(total * k), 3, 1);
  const std::vector<float> w = random_vector(static_cast<size_t>(n * k), 3, 2);
  auto product = [&](int64_t m) {
    std::vector<float> c(static_cast<size_t>(m * n));
    matmul(a.data(), w.data(), c.data(), m, n, k, false, true, false);
    return c;
  };
  const std::vector<float> all = product(total);
  int differing = 0;
  for (int64_t m = 1; m < total; ++m)
    differing += std::memcmp(product(m).data(), all.data(), sizeof(float) * static_cast<size_t>(m * n)) != 0;
  EXPECT_GT(differing, 0)
      << "every plain product of 1.." << total - 1
      << " rows matched: this oneDNN needs no row quantum (and the docs' reason is stale)";
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
