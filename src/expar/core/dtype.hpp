#pragma once
// Element types of expar tensors, with their safetensors names.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace expar {

enum class DType : uint8_t { F32, F16, BF16, F8E4M3, E8M0, I32, I64, U8, F64 };

size_t dtype_size(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I32", "I64", "U8", "F64".
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; throws expar::Error naming the accepted spellings for an unknown name.
DType dtype_from_name(std::string_view name);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}

}  // namespace expar
