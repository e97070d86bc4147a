#pragma once
// Out-of-place transpose of a row-major f32 matrix with leading dimensions: dst[c, r] = src[r, c]. For the
// expert MLP's column form (moe/expert_mlp.cpp), whose products take the rows of a batch as columns.
// Elementwise copies only: the thread count never changes a result.
#include <cstdint>

namespace expar {

// src is [rows, cols] with row stride ld_src (>= cols); dst is [cols, rows] with row stride ld_dst (>= rows).
// The two must not overlap. Large matrices are spread over the calling thread's compute threads.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

// The same result, for a destination that is read long after and not by the caller's next steps (the expert
// MLP's saved pre-activations, which the backward reads back): each full 16 x 16 tile's 16-float runs are
// written with non-temporal stores (SSE's movntps where the run is 16-byte aligned; ragged tiles and
// unaligned runs with plain stores). A cache line written whole this way is neither read from memory first
// nor kept in cache, so the caller's working set (the expert's scratch, its next weights) stays where it
// was; the EP paths' forward grouped GEMM was faster with it than with plain stores in every alternated pair
// (docs/performance_history.md, "Saved pre-activations written past the cache"). Ends with a store fence on
// every thread that wrote, so a thread that synchronises with the caller afterwards sees every element.
void transpose_streaming(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                         int64_t ld_dst);

}  // namespace expar
