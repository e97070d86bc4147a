#pragma once
// Tensors of a checkpoint's storage dtypes as f32 (the dtype every layer computes in).
#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"

namespace expar {

// An f32 copy of `t` (F32, BF16 or F16), charged to `category`; other dtypes throw expar::Error naming it.
Tensor to_f32(const Tensor& t, MemCategory category);
// A BF16 copy of an F32 tensor, each value rounded to the nearest BF16 (ties to even: core/convert.hpp's
// f32_to_bf16), charged to `category`; other dtypes throw expar::Error naming it.
Tensor to_bf16(const Tensor& t, MemCategory category);

}  // namespace expar
