#pragma once
// Element-wise reduction shared by the backends: acc[i] = op(acc[i], src[i]). Collectives call it once per
// contribution in rank order 0..size-1, which is what makes their sums bit-identical whatever the timing.
#include <cstddef>

#include "expar/comm/comm.hpp"
#include "expar/core/dtype.hpp"

namespace expar {

// Throws expar::Error for a dtype other than f32, f64, i32, i64 (the ones collectives reduce).
void check_reducible(DType dtype, const char* op);
void reduce_into(void* acc, const void* src, size_t count, DType dtype, ReduceOp op);

}  // namespace expar
