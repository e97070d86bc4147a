#include "expar/comm/reduce.hpp"

#include <cstdint>

#include "expar/core/error.hpp"

namespace expar {

namespace {

template <typename T>
void reduce_float(T* acc, const T* src, size_t count, ReduceOp op) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < count; ++i) acc[i] += src[i];
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] = src[i] > acc[i] ? src[i] : acc[i];
  }
}

// Integer sums wrap (two's complement) instead of overflowing into undefined behaviour.
template <typename T, typename U>
void reduce_int(T* acc, const T* src, size_t count, ReduceOp op) {
  if (op == ReduceOp::Sum) {
    for (size_t i = 0; i < count; ++i)
      acc[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(src[i]));
  } else {
    for (size_t i = 0; i < count; ++i) acc[i] = src[i] > acc[i] ? src[i] : acc[i];
  }
}

}  // namespace

void check_reducible(DType dtype, const char* op) {
  EXPAR_CHECK(dtype == DType::F32 || dtype == DType::F64 || dtype == DType::I32 || dtype == DType::I64,
              "{}: dtype {} cannot be reduced; use F32, F64, I32 or I64", op, dtype_name(dtype));
}

void reduce_into(void* acc, const void* src, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::F32:
      return reduce_float(static_cast<float*>(acc), static_cast<const float*>(src), count, op);
    case DType::F64:
      return reduce_float(static_cast<double*>(acc), static_cast<const double*>(src), count, op);
    case DType::I32:
      return reduce_int<int32_t, uint32_t>(static_cast<int32_t*>(acc), static_cast<const int32_t*>(src),
                                           count, op);
    case DType::I64:
      return reduce_int<int64_t, uint64_t>(static_cast<int64_t*>(acc), static_cast<const int64_t*>(src),
                                           count, op);
    default:
      check_reducible(dtype, "reduce");
  }
}

}  // namespace expar
