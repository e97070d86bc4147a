#include "expar/core/matvec.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace expar {
namespace {

using Lanes = float __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;

// Below this many weights in all a batch stays on the calling thread (the region would cost more than it
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

// Rows [begin, end) of one product: whole 4-row blocks, then single rows (only the product's last rows).
void rows(const MatvecProduct& p, int64_t begin, int64_t end) {
  int64_t j = begin;
  for (; j + kRows <= end; j += kRows)
    rows_dot<kRows>(p.a, p.b + j * p.ldb, p.ldb, p.k, p.c + j, p.accumulate);
  for (; j < end; ++j) rows_dot<1>(p.a, p.b + j * p.ldb, p.ldb, p.k, p.c + j, p.accumulate);
}

int64_t chunk_rows(const MatvecProduct& p) {
  const int64_t row_bytes = std::max<int64_t>(p.k, 1) * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, kChunkBytes / row_bytes / kRows) * kRows;
}

}  // namespace

void matvec_transposed(std::span<const MatvecProduct> products) {
  int64_t weights = 0;
  for (const MatvecProduct& p : products) weights += p.n * p.k;
  if (weights < kParallelMin || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (const MatvecProduct& p : products) rows(p, 0, p.n);
    return;
  }
  // The chunks of every product, in product order: chunk c covers rows [first[c], first[c] + count) of
  // product owner[c]. Dealt one at a time to whichever thread is free (schedule dynamic): the threads read
  // at different speeds from moment to moment, and a static split left the faster one waiting at the end of
  // every region (libgomp's spin was 18 % of a decode step's samples at TP 1 on the Zen 5 VM).
  struct Chunk {
    int32_t product;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < products.size(); ++i) {
    const MatvecProduct& p = products[i];
    const int64_t step = chunk_rows(p);
    for (int64_t begin = 0; begin < p.n; begin += step)
      chunks.push_back(Chunk{static_cast<int32_t>(i), begin, std::min(p.n, begin + step)});
  }
  const auto count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < count; ++c) {
    const Chunk& chunk = chunks[static_cast<size_t>(c)];
    rows(products[static_cast<size_t>(chunk.product)], chunk.begin, chunk.end);
  }
}

void matvec_transposed(const float* a, const float* b, float* c, int64_t n, int64_t k, int64_t ldb,
                       bool accumulate) {
  const MatvecProduct p{a, b, c, n, k, ldb, accumulate};
  matvec_transposed(std::span<const MatvecProduct>(&p, 1));
}

}  // namespace expar
