#include "expar/core/transpose.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"

namespace expar {
namespace {

// 16 x 16 tiles: a tile's 16 source rows and 16 destination rows (1 KiB each way) stay in L1 while it is
// copied, whatever the two strides (probes on the Zen 5 VM, one thread: 1024 x 128 into a 1040-float stride
// in 25-37 us; into a 1024-float stride, 4 KiB, 93 us).
constexpr int64_t kTile = 16;
// Below this many elements the copy stays on the calling thread (a region costs more than it saves).
constexpr int64_t kParallelMin = int64_t{1} << 15;

void transpose_tile(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
                    int64_t cols) {
  if (rows == kTile && cols == kTile) {  // the full tile, with constant bounds the compiler unrolls
    for (int64_t c = 0; c < kTile; ++c)
      for (int64_t r = 0; r < kTile; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
    return;
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace

void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  EXPAR_ASSERT(rows >= 0 && cols >= 0 && ld_src >= cols && ld_dst >= rows,
               "transpose of [{}, {}] with strides {} -> {}", rows, cols, ld_src, ld_dst);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t t = 0; t < row_tiles; ++t) {
    const int64_t r = t * kTile, tile_rows = std::min(kTile, rows - r);
    for (int64_t c = 0; c < cols; c += kTile)
      transpose_tile(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst, tile_rows,
                     std::min(kTile, cols - c));
  }
}

}  // namespace expar
