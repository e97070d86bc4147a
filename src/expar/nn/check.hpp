#pragma once
// Argument checks shared by the nn layers: each failure names the layer, the argument, what it holds and
// what it must hold, so a wrong shape at model assembly is found at the call that got it.
#include <string_view>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/tensor.hpp"
#include "expar/core/weight_view.hpp"

namespace expar::nn {

// `t` must be a defined f32 tensor of exactly `shape`.
inline void check_f32(const Tensor& t, std::string_view layer, std::string_view arg, const Shape& shape) {
  EXPAR_ASSERT(t.defined(), "{}: argument {} is an undefined tensor: pass a tensor of shape {}", layer, arg,
               shape_string(shape));
  EXPAR_ASSERT(t.dtype() == DType::F32, "{}: {} holds {}: it must be F32", layer, arg, dtype_name(t.dtype()));
  EXPAR_ASSERT(t.shape() == shape, "{}: {} has shape {}: it must have shape {}", layer, arg,
               shape_string(t.shape()), shape_string(shape));
}

// `t` must be a defined f32 matrix; returns nothing, the caller reads the dimensions.
inline void check_f32_matrix(const Tensor& t, std::string_view layer, std::string_view arg) {
  EXPAR_ASSERT(t.defined(), "{}: argument {} is an undefined tensor: pass an f32 matrix", layer, arg);
  EXPAR_ASSERT(t.dtype() == DType::F32 && t.ndim() == 2, "{}: {} is {} of shape {}: it must be an F32 matrix",
               layer, arg, dtype_name(t.dtype()), shape_string(t.shape()));
}

// `t` must be a defined weight matrix of `shape` held as F32, BF16 or F16 (core/weight_view.hpp's
// weight_view multiplies it as stored).
inline void check_weight(const Tensor& t, std::string_view layer, std::string_view arg, const Shape& shape) {
  EXPAR_ASSERT(t.defined(), "{}: argument {} is an undefined tensor: pass a tensor of shape {}", layer, arg,
               shape_string(shape));
  EXPAR_ASSERT(held_as_stored(t), "{}: {} holds {}: a weight must be F32, BF16, F16 or block-scaled FP8",
               layer, arg, dtype_name(t.dtype()));
  EXPAR_ASSERT(t.shape() == shape, "{}: {} has shape {}: it must have shape {}", layer, arg,
               shape_string(t.shape()), shape_string(shape));
}

inline void check_i32(const Tensor& t, std::string_view layer, std::string_view arg, int64_t n) {
  EXPAR_ASSERT(t.defined() && t.dtype() == DType::I32 && t.shape() == Shape{n},
               "{}: {} is {} of shape {}: it must be I32 of shape [{}]", layer, arg, dtype_name(t.dtype()),
               shape_string(t.shape()), n);
}

}  // namespace expar::nn
