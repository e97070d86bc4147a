#include "expar/core/tensor_convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/weight_view.hpp"

namespace expar {

Tensor to_f32(const Tensor& t, MemCategory category) {
  Tensor out = Tensor::empty(t.shape(), DType::F32, category);
  float* o = out.data<float>();
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32:
      std::memcpy(o, t.raw(), sizeof(float) * static_cast<size_t>(n));
      break;
    case DType::BF16: {
      const auto* p = static_cast<const uint16_t*>(t.raw());
      for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(p[i]);
      break;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint16_t*>(t.raw());
      for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(p[i]);
      break;
    }
    case DType::F8E4M3:
      if (t.block_scales() != nullptr && t.ndim() >= 1) {
        const int64_t cols = t.shape().back();
        dequantize_rows(weight_view(t.reshape({cols == 0 ? 0 : n / cols, cols})), 0, cols == 0 ? 0 : n / cols,
                        o, cols);
        break;
      }
      [[fallthrough]];
    default:
      fail("a weight of dtype {} cannot be loaded: expar loads F32, BF16, F16 or block-scaled FP8 weights",
           dtype_name(t.dtype()));
  }
  return out;
}

Tensor to_bf16(const Tensor& t, MemCategory category) {
  EXPAR_CHECK(t.dtype() == DType::F32, "to_bf16 converts F32 tensors, not {}", dtype_name(t.dtype()));
  Tensor out = Tensor::empty(t.shape(), DType::BF16, category);
  const float* p = t.data<float>();
  auto* o = static_cast<uint16_t*>(out.raw());
  for (int64_t i = 0; i < t.numel(); ++i) o[i] = f32_to_bf16(p[i]);
  return out;
}

void refresh_bf16_copy(const Tensor& master, Tensor& copy, MemCategory category) {
  EXPAR_CHECK(master.dtype() == DType::F32, "BF16 copies are made from F32 weights, not {} {}",
              dtype_name(master.dtype()), shape_string(master.shape()));
  if (!(copy.defined() && copy.dtype() == DType::BF16 && copy.shape() == master.shape()))
    copy = Tensor::empty(master.shape(), DType::BF16, category);
  round_rows_to_bf16(master.data<float>(), master.numel(), static_cast<uint16_t*>(copy.raw()), master.numel(),
                     1, master.numel());
}

Tensor to_fp8_blocks(const Tensor& t, MemCategory category) {
  EXPAR_CHECK(t.ndim() >= 1 && (t.dtype() == DType::F32 || t.dtype() == DType::BF16),
              "FP8 weights are made from F32 or BF16 tensors, not {} {}", dtype_name(t.dtype()),
              shape_string(t.shape()));
  const Tensor values = t.dtype() == DType::F32 ? t : to_f32(t, category);
  const int64_t cols = t.shape().back(), rows = cols == 0 ? 0 : t.numel() / cols;
  const int64_t grid_rows = (rows + kFp8Block - 1) / kFp8Block,
                grid_cols = (cols + kFp8Block - 1) / kFp8Block;
  Tensor codes = Tensor::empty(t.shape(), DType::F8E4M3, category);
  Tensor scales = Tensor::empty({grid_rows, grid_cols}, DType::F32, category);
  const float* v = values.data<float>();
  auto* c = static_cast<uint8_t*>(codes.raw());
  float* s = scales.data<float>();
  for (int64_t br = 0; br < grid_rows; ++br)
    for (int64_t bc = 0; bc < grid_cols; ++bc) {
      const int64_t r0 = br * kFp8Block, r1 = std::min(rows, r0 + kFp8Block);
      const int64_t c0 = bc * kFp8Block, c1 = std::min(cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = c0; k < c1; ++k) amax = std::max(amax, std::fabs(v[r * cols + k]));
      const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
      s[br * grid_cols + bc] = scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = c0; k < c1; ++k) c[r * cols + k] = f32_to_e4m3(v[r * cols + k] / scale);
    }
  return codes.with_block_scales(std::move(scales));
}

}  // namespace expar
