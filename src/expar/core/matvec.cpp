#include "expar/core/matvec.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace expar {
namespace {

using Lanes = float __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;

// Below this many weights a product stays on the calling thread (the region would cost more than it
// saves).
constexpr int64_t kParallelMin = int64_t{1} << 16;

// Four rows at a time: of 2, 4 and 8 rows per block (and one row with 4 or 8 accumulators), 4 read the
// weights fastest in a probe on the Zen 5 VM (docs/performance.md).
constexpr int64_t kRows = 4;

// About this many weight bytes per chunk a thread takes at a time (rounded to whole 4-row blocks): large
// enough that a chunk streams (32 rows of a 1024-wide matrix), small enough that a region of 2 MiB has 16.
constexpr int64_t kChunkBytes = int64_t{128} << 10;

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

// Rows [begin, end): whole 4-row blocks, then single rows (only the product's last rows).
void rows(const float* a, const float* b, float* c, int64_t begin, int64_t end, int64_t k, int64_t ldb,
          bool accumulate) {
  int64_t j = begin;
  for (; j + kRows <= end; j += kRows) rows_dot<kRows>(a, b + j * ldb, ldb, k, c + j, accumulate);
  for (; j < end; ++j) rows_dot<1>(a, b + j * ldb, ldb, k, c + j, accumulate);
}

}  // namespace

void matvec_transposed(const float* a, const float* b, float* c, int64_t n, int64_t k, int64_t ldb,
                       bool accumulate) {
  if (n * k < kParallelMin || omp_in_parallel() || omp_get_max_threads() == 1) {
    rows(a, b, c, 0, n, k, ldb, accumulate);
    return;
  }
  // Chunks dealt one at a time to whichever thread is free (schedule dynamic): the threads read at
  // different speeds from moment to moment, and a static split left the faster one waiting at the end of
  // every region (libgomp's spin was 18.7 % of a decode profile's samples at TP 1 on the Zen 5 VM, 9.8 %
  // with the chunks; docs/performance.md, "Huge pages and m = 1 products dealt in chunks").
  const int64_t row_bytes = std::max<int64_t>(k, 1) * static_cast<int64_t>(sizeof(float));
  const int64_t step = std::max<int64_t>(1, kChunkBytes / row_bytes / kRows) * kRows;
  const int64_t chunks = (n + step - 1) / step;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    rows(a, b, c, chunk * step, std::min(n, (chunk + 1) * step), k, ldb, accumulate);
}

}  // namespace expar
