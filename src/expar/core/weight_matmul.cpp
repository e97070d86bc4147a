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
// The column form's tiles are sgemm's left operand, multiplied with xᵀ as it is: small enough to stay in the
// core's own cache beside xᵀ, and at least kMinColumnTileRows rows (shorter tiles ran sgemm below its rate).
constexpr int64_t kColumnTileBytes = int64_t{512} << 10;
constexpr int64_t kMinColumnTileRows = 128;

// Rows dequantised per thread task: elementwise, so the thread count never changes a value.
constexpr int64_t kParallelDecodeMin = int64_t{1} << 16;

int64_t tile_rows(int64_t k, int64_t bytes, int64_t min_rows) {
  const int64_t rows = bytes / (static_cast<int64_t>(sizeof(float)) * std::max<int64_t>(k, 1));
  return std::max(min_rows, rows / kTileQuantum * kTileQuantum);
}

// Per thread, the tiles of both forms.
std::vector<float>& tile_scratch() {
  thread_local std::vector<float> scratch;
  return scratch;
}

// multiply(t, r0, rows) for rows [r0, r0 + rows) of w dequantised into t ([rows, k], packed), tile after tile
// of at most `tile` rows, each decoded once.
template <typename Multiply>
void for_each_dequantised_tile(const WeightView& w, int64_t tile, Multiply&& multiply) {
  const int64_t n = w.rows, k = w.cols;
  tile = std::min(n, tile);
  std::vector<float>& scratch = tile_scratch();
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
    multiply(static_cast<const float*>(t), r0, rows);
  }
}

}  // namespace

int64_t weight_tile_rows(int64_t k) {
  return tile_rows(k, kTileBytes, kMinTileRows);
}

int64_t weight_column_tile_rows(int64_t k) {
  return tile_rows(k, kColumnTileBytes, kMinColumnTileRows);
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
  for_each_dequantised_tile(w, weight_tile_rows(k),
                            [&](const float* t, int64_t r0, int64_t rows) { multiply(t, r0, rows, k); });
}

void matmul_weight_columns(const WeightColumnsProduct& p) {
  const WeightView& w = p.w;
  w.validate();
  const int64_t n = w.rows, k = w.cols;
  EXPAR_CHECK(p.cols >= 0, "weight product in the column form with {} columns: must be 0 or more", p.cols);
  if (p.cols == 0 || n == 0) return;
  // yᵀ[r0 : r0 + rows, :] = B[rows, k] · xᵀ for f32 rows B of stride ldb.
  auto multiply = [&](const float* b, int64_t r0, int64_t rows, int64_t ldb) {
    matmul(
        MatmulArgs{.a = b, .b = p.xt, .c = p.yt + r0 * p.cols, .m = rows, .n = p.cols, .k = k, .lda = ldb});
  };
  if (w.format == WeightFormat::F32) return multiply(static_cast<const float*>(w.data), 0, n, w.ld);
  for_each_dequantised_tile(w, weight_column_tile_rows(k),
                            [&](const float* t, int64_t r0, int64_t rows) { multiply(t, r0, rows, k); });
}

}  // namespace expar
