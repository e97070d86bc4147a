#include "expar/core/transpose.hpp"

#include <algorithm>
#include <cstdint>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "expar/core/assert.hpp"

namespace expar {
namespace {

// 16 x 16 tiles: a tile's 16 source rows and 16 destination rows (1 KiB each way) stay in L1 while it is
// copied, whatever the two strides. A destination stride of a multiple of 4 KiB still maps a tile's 16 rows
// onto the same cache sets, hence the padded strides of the expert MLP (docs/performance_history.md, "The
// column form").
constexpr int64_t kTile = 16;
// Below this many elements the copy stays on the calling thread (a region costs more than it saves).
constexpr int64_t kParallelMin = int64_t{1} << 15;

// Writes the 16 floats of `run` to dst, non-temporally where dst is 16-byte aligned.
void store_run_streaming(const float* run, float* dst) {
#if defined(__SSE__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    for (int64_t i = 0; i < kTile; i += 4) _mm_stream_ps(dst + i, _mm_load_ps(run + i));
    return;
  }
#endif
  std::copy(run, run + kTile, dst);
}

void store_fence() {
#if defined(__SSE__)
  _mm_sfence();
#endif
}

template <bool kStreaming>
void transpose_tile(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
                    int64_t cols) {
  if (rows == kTile && cols == kTile) {  // the full tile, with constant bounds the compiler unrolls
    for (int64_t c = 0; c < kTile; ++c) {
      if constexpr (kStreaming) {
        alignas(64) float run[kTile];
        for (int64_t r = 0; r < kTile; ++r) run[r] = src[r * ld_src + c];
        store_run_streaming(run, dst + c * ld_dst);
      } else {
        for (int64_t r = 0; r < kTile; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
      }
    }
    return;
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
}

template <bool kStreaming>
void transpose_with(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  EXPAR_ASSERT(rows >= 0 && cols >= 0 && ld_src >= cols && ld_dst >= rows,
               "transpose of [{}, {}] with strides {} -> {}", rows, cols, ld_src, ld_dst);
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
#pragma omp parallel if (rows * cols > kParallelMin)
  {
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < row_tiles; ++t) {
      const int64_t r = t * kTile, tile_rows = std::min(kTile, rows - r);
      for (int64_t c = 0; c < cols; c += kTile)
        transpose_tile<kStreaming>(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst, tile_rows,
                                   std::min(kTile, cols - c));
    }
    if constexpr (kStreaming) store_fence();  // each writing thread, before the region's closing barrier
  }
}

}  // namespace

void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
  transpose_with<false>(src, rows, cols, ld_src, dst, ld_dst);
}

void transpose_streaming(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                         int64_t ld_dst) {
  transpose_with<true>(src, rows, cols, ld_src, dst, ld_dst);
}

}  // namespace expar
