#include "expar/core/matvec.hpp"

#include <cstring>

namespace expar {
namespace {

using Lanes = float __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;

// Below this many weights a product stays on the calling thread (the region would cost more than it saves).
constexpr int64_t kParallelMin = int64_t{1} << 16;

// Four rows at a time: of 2, 4 and 8 rows per block (and one row with 4 or 8 accumulators), 4 read the
// weights fastest in a probe on the Zen 5 VM (docs/performance.md).
constexpr int64_t kRows = 4;

template <int64_t R>
void rows_dot(const float* a, const float* b, int64_t ldb, int64_t k, float* c, bool accumulate) {
  Lanes sum[R];
  for (int64_t r = 0; r < R; ++r) sum[r] = Lanes{};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    Lanes x;
    std::memcpy(&x, a + i, sizeof x);
    for (int64_t r = 0; r < R; ++r) {
      Lanes w;
      std::memcpy(&w, b + r * ldb + i, sizeof w);
      sum[r] += x * w;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float total = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) total += sum[r][l];
    for (int64_t j = i; j < k; ++j) total += a[j] * b[r * ldb + j];
    c[r] = accumulate ? c[r] + total : total;
  }
}

}  // namespace

void matvec_transposed(const float* a, const float* b, float* c, int64_t n, int64_t k, int64_t ldb,
                       bool accumulate) {
  const int64_t blocks = n / kRows;
#pragma omp parallel for schedule(static) if (n * k >= kParallelMin)
  for (int64_t block = 0; block < blocks; ++block)
    rows_dot<kRows>(a, b + block * kRows * ldb, ldb, k, c + block * kRows, accumulate);
  for (int64_t j = blocks * kRows; j < n; ++j) rows_dot<1>(a, b + j * ldb, ldb, k, c + j, accumulate);
}

}  // namespace expar
