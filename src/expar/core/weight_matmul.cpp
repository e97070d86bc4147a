#include "expar/core/weight_matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matvec.hpp"
#include "expar/core/product_precision.hpp"

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

// Under ProductPrecision::BF16, whether a product over w multiplies BF16 activations in oneDNN's BF16 matmul:
// BF16 weights outside batch invariance (matmul_bf16 refuses its row quantum).
bool runs_bf16_matmul(const WeightView& w) {
  return w.format == WeightFormat::BF16 && matmul_min_rows() == 0;
}

// Rows [rows, cols] of x (row stride ld) rounded to BF16, packed, in per-thread scratch kept until the next
// call on this thread.
const uint16_t* rounded_bf16(const float* x, int64_t ld, int64_t rows, int64_t cols) {
  thread_local std::vector<uint16_t> scratch;
  scratch.resize(static_cast<size_t>(rows * cols));
  round_rows_to_bf16(x, ld, scratch.data(), cols, rows, cols);
  return scratch.data();
}

// The same as f32 values (exact), for the products over f32 tiles.
const float* rounded_values(const float* x, int64_t ld, int64_t rows, int64_t cols) {
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(rows * cols));
  round_rows_to_bf16_values(x, ld, scratch.data(), cols, rows, cols);
  return scratch.data();
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
  int64_t ldx = p.ldx >= 0 ? p.ldx : k;
  const int64_t ldy = p.ldy >= 0 ? p.ldy : n;
  EXPAR_CHECK(p.m >= 0 && ldx >= k && ldy >= n,
              "weight product m={} with x stride {} and y stride {} for a weight [{}, {}]", p.m, ldx, ldy, n,
              k);
  if (p.m == 0 || n == 0) return;
  const float* x = p.x;
  // y[:, r0 : r0 + rows] (+)= x · B[rows, k]ᵀ for f32 rows B of stride ldb.
  auto multiply = [&](const float* b, int64_t r0, int64_t rows, int64_t ldb) {
    matmul(MatmulArgs{.a = x,
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
  // core/matvec rounds the activations itself under BF16 precision.
  if (matmul_runs_matvec(p.m, false, true)) return matvec_transposed(p.x, w, p.y, p.accumulate);
  if (rounds_activations(product_precision(), false)) {
    if (runs_bf16_matmul(w)) {
      matmul_bf16({.a = rounded_bf16(p.x, ldx, p.m, k),
                   .b = static_cast<const uint16_t*>(w.data),
                   .c = p.y,
                   .m = p.m,
                   .n = n,
                   .k = k,
                   .trans_b = true,
                   .accumulate = p.accumulate,
                   .ldb = w.ld,
                   .ldc = ldy});
      return;
    }
    x = rounded_values(p.x, ldx, p.m, k);
    ldx = k;
  }
  for_each_dequantised_tile(w, weight_tile_rows(k),
                            [&](const float* t, int64_t r0, int64_t rows) { multiply(t, r0, rows, k); });
}

void matmul_weight_columns(const WeightColumnsProduct& p) {
  const WeightView& w = p.w;
  w.validate();
  const int64_t n = w.rows, k = w.cols;
  EXPAR_CHECK(p.cols >= 0, "weight product in the column form with {} columns: must be 0 or more", p.cols);
  if (p.cols == 0 || n == 0) return;
  const float* xt = p.xt;
  // yᵀ[r0 : r0 + rows, :] = B[rows, k] · xᵀ for f32 rows B of stride ldb.
  auto multiply = [&](const float* b, int64_t r0, int64_t rows, int64_t ldb) {
    matmul(MatmulArgs{.a = b, .b = xt, .c = p.yt + r0 * p.cols, .m = rows, .n = p.cols, .k = k, .lda = ldb});
  };
  if (w.format == WeightFormat::F32) return multiply(static_cast<const float*>(w.data), 0, n, w.ld);
  if (rounds_activations(product_precision(), false)) {
    if (runs_bf16_matmul(w)) {
      matmul_bf16({.a = static_cast<const uint16_t*>(w.data),
                   .b = rounded_bf16(p.xt, p.cols, k, p.cols),
                   .c = p.yt,
                   .m = n,
                   .n = p.cols,
                   .k = k,
                   .lda = w.ld});
      return;
    }
    xt = rounded_values(p.xt, p.cols, k, p.cols);
  }
  for_each_dequantised_tile(w, weight_column_tile_rows(k),
                            [&](const float* t, int64_t r0, int64_t rows) { multiply(t, r0, rows, k); });
}

}  // namespace expar
