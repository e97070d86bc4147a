#include "expar/core/tensor_convert.hpp"

#include <cstring>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"

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
    default:
      fail("a weight of dtype {} cannot be loaded: expar loads F32, BF16 or F16 weights",
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

}  // namespace expar
