#pragma once
// Helpers shared by the io tests: byte-level safetensors construction (temporary folders: tests/common/).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar::test {

// A safetensors file from a raw header text: 8-byte little-endian `length` (default: the header's size),
// the header, then `data_bytes` bytes counting up from 0.
inline std::vector<std::byte> raw_file(std::string_view header, size_t data_bytes, int64_t length = -1) {
  uint64_t n = length < 0 ? header.size() : static_cast<uint64_t>(length);
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i & 0xFF));
  return out;
}

// A tensor of `shape` and `dtype` whose bytes are a deterministic function of `seed` and the byte position.
inline Tensor patterned(Shape shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  auto* p = static_cast<uint8_t*>(t.raw());
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
  return t;
}

inline std::vector<std::byte> tensor_bytes(const Tensor& t) {
  const auto* p = static_cast<const std::byte*>(t.raw());
  return {p, p + t.nbytes()};
}

}  // namespace expar::test
