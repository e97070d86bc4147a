#pragma once
// f32 -> BF16 bits, nearest with ties to even, NaN kept NaN (quiet, sign kept): core/convert.hpp's
// f32_to_bf16 (which the tests compare it with), inline and branch-free so that the loops over rows that
// call it (the BF16 payload codec, the activations a BF16 product reads, SwiGLU writing them) vectorise;
// and BF16 bits -> f32 (exact), inline for the loops that read BF16 rows (SwiGLU on saved pre-activations).
#include <bit>
#include <cstdint>

namespace expar {

inline uint16_t round_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

inline float widen_bf16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

}  // namespace expar
