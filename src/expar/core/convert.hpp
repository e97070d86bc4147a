#pragma once
// Scalar conversions between f32 and the narrow formats, all round-to-nearest-even.
//  - bf16: the upper 16 bits of an IEEE f32; NaN stays NaN (quiet), overflow rounds to infinity.
//  - f16: IEEE binary16.
//  - fp8 e4m3 (OCP Microscaling): bias 7, max normal 448, no infinity, NaN = S.1111.111; finite values
//    beyond 448 saturate to ±448, ±inf saturates to ±448, NaN maps to NaN.
//  - e8m0 (OCP Microscaling scale): 2^(code-127), code 0xFF is NaN, no zero and no sign. Encoding rounds
//    the exponent of a positive value to the nearest power of two (ties to even code); values below 2^-127
//    clamp to code 0 and above 2^127 to code 254; zero, negative and NaN inputs encode as NaN (0xFF).
//  - fp4 e2m1 (OCP Microscaling element, decode only): sign bit 3, then {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
#include <cstdint>
#include <cstring>

namespace expar {

uint16_t f32_to_bf16(float value);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);
uint8_t f32_to_e4m3(float value);
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e8m0(float value);
float e8m0_to_f32(uint8_t bits);

// Whether any of n E4M3 codes is a NaN code (S.1111.111). Inline, like e2m1_to_f32 below: core/tensor
// checks FP8 weights with it, and the fuzz builds compile core/tensor without this header's .cpp.
inline bool has_e4m3_nan(const uint8_t* codes, int64_t n) {
  // Eight codes a word: a byte's low seven bits plus one set its bit 7 exactly when they are all ones (a NaN
  // code), and no carry crosses into the next byte.
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, codes + i, sizeof word);
    const uint64_t magnitudes = word & kLow7;
    if (((magnitudes + 0x0101010101010101ull) & ~kLow7) != 0) return true;
  }
  for (; i < n; ++i)
    if ((codes[i] & 0x7f) == 0x7f) return true;
  return false;
}

// Inline: io/mxfp4's decoder uses it, and the fuzz builds compile io without this file (clang there has no
// x86 _Float16).
inline float e2m1_to_f32(uint8_t code) {  // the low 4 bits of code
  constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) ? -m : m;
}

}  // namespace expar
