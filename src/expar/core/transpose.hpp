#pragma once
// Out-of-place transpose of a row-major f32 matrix with leading dimensions: dst[c, r] = src[r, c]. For the
// expert MLP's column form (moe/expert_mlp.cpp), whose products take the rows of a batch as columns.
// Elementwise copies only: the thread count never changes a result.
#include <cstdint>

namespace expar {

// src is [rows, cols] with row stride ld_src (>= cols); dst is [cols, rows] with row stride ld_dst (>= rows).
// The two must not overlap. Large matrices are spread over the calling thread's compute threads.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

}  // namespace expar
