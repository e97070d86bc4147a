#pragma once
// Tensors of a checkpoint's storage dtypes as f32 (the dtype every layer computes in).
#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"

namespace expar {

// An f32 copy of `t` (F32, BF16, F16, or block-scaled FP8: each code's value times its block's multiplier),
// charged to `category`; other dtypes throw expar::Error naming it.
Tensor to_f32(const Tensor& t, MemCategory category);
// A BF16 copy of an F32 tensor, each value rounded to the nearest BF16 (ties to even: core/convert.hpp's
// f32_to_bf16), charged to `category`; other dtypes throw expar::Error naming it.
Tensor to_bf16(const Tensor& t, MemCategory category);
// The BF16 copy of an F32 master that mixed-precision products read (issue #35), the same values as to_bf16:
// made when `copy` is undefined or of another shape (charged to `category`), else refreshed in place, so
// that every view of it sees the new values.
void refresh_bf16_copy(const Tensor& master, Tensor& copy, MemCategory category);
// Block-scaled FP8 of an F32 or BF16 tensor seen as the matrix [numel / C, C] (C its last dimension): each
// 128 × 128 block's multiplier is its largest magnitude / 448 (1 for a block of zeros), each code the E4M3
// value nearest to value / multiplier (ties to even), as DeepSeek-V3's FP8 weights are made. Codes and scales
// are charged to `category`.
Tensor to_fp8_blocks(const Tensor& t, MemCategory category);

}  // namespace expar
