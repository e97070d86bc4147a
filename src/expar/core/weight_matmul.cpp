#include "expar/core/weight_matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matvec.hpp"

namespace expar {

namespace {

// About this many bytes of dequantised weights per tile: well inside the last-level cache, and tall enough
// that sgemm's packing of x, repeated for every tile, stays a small share of each tile's product.
constexpr int64_t kTileBytes = int64_t{2} << 20;
constexpr int64_t kTileQuantum = 16;
constexpr int64_t kMinTileRows = 64;

// Rows dequantised per thread task: elementwise, so the thread count never changes a value.
constexpr int64_t kParallelDecodeMin = int64_t{1} << 16;

}  // namespace

int64_t weight_tile_rows(int64_t k) {
  const int64_t rows = kTileBytes / (static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(k, 1));
  return std::max(kMinTileRows, rows / kTileQuantum * kTileQuantum);
}

void matmul_weight(const WeightProduct& p) {
  const WeightView& w = p.w;
  w.validate();
  const int64_t n = w.rows, k = w.cols;
  const int64_t ldx = p.ldx >= 0 ? p.ldx : k, ldy = p.ldy >= 0 ? p.ldy : n;
  EXPAR_CHECK(p.m >= 0 && ldx >= k && ldy >= n,
              "weight product m={} with x stride {} and y stride {} for a weight [{}, {}]", p.m, ldx, ldy, n,
              k);
  if (p.m == 0 || n == 0) return;
  // y[:, r0 : r0 + rows] (+)= x · B[rows, k]ᵀ for f32 rows B of stride ldb.
  auto multiply = [&](const float* b, int64_t r0, int64_t rows, int64_t ldb) {
    matmul(MatmulArgs{.a = p.x,
                      .b = b,
                      .c = p.y + r0,
                      .m = p.m,
                      .n = rows,
                      .k = k,
                      .trans_b = true,
                      .accumulate = p.accumulate,
                      .lda = ldx,
                      .ldb = ldb,
                      .ldc = ldy});
  };
  if (w.format == WeightFormat::F32) return multiply(static_cast<const float*>(w.data), 0, n, w.ld);
  if (matmul_runs_matvec(p.m, false, true)) return matvec_transposed(p.x, w, p.y, p.accumulate);
  const int64_t tile = std::min(n, weight_tile_rows(k));
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(tile * k));
  float* t = scratch.data();
  for (int64_t r0 = 0; r0 < n; r0 += tile) {
    const int64_t rows = std::min(tile, n - r0);
    // Groups of kTileQuantum rows, each one dequantize_rows call (it checks the view once per call).
    const int64_t groups = (rows + kTileQuantum - 1) / kTileQuantum;
#pragma omp parallel for schedule(static) if (rows * k >= kParallelDecodeMin && !omp_in_parallel())
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = r0 + g * kTileQuantum, end = std::min(r0 + rows, begin + kTileQuantum);
      dequantize_rows(w, begin, end, t + (begin - r0) * k, k);
    }
    multiply(t, r0, rows, k);
  }
}

}  // namespace expar
