#include "expar/core/convert.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include "expar/core/bf16_round.hpp"

namespace expar {

uint16_t f32_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // keep sign, force quiet
  uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float bf16_to_f32(uint16_t bits) {
  return widen_bf16(bits);
}

uint16_t f32_to_f16(float value) {
  // The compiler's _Float16 conversion is IEEE round-to-nearest-even, including subnormals and overflow.
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}

float f16_to_f32(uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

namespace {
constexpr float kE4M3MaxNormal = 448.0f;
}

uint8_t f32_to_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | 0x7F;
  float magnitude = std::fabs(value);
  if (magnitude >= kE4M3MaxNormal) return sign | 0x7E;  // saturate: ±448 (also for ±inf)
  if (magnitude < 0x1p-6f) {
    // Subnormal range: step 2^-9. nearbyint rounds half to even in the default rounding mode.
    int steps = static_cast<int>(std::nearbyint(magnitude * 0x1p9f));
    return sign | static_cast<uint8_t>(steps);  // steps == 8 is exactly the smallest normal, code 0x08
  }
  int exponent = 0;
  float fraction =
      std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent, fraction in [0.5,1)
  int unbiased = exponent - 1;
  float mantissa = fraction * 2.0f;  // in [1, 2)
  int steps = static_cast<int>(std::nearbyint((mantissa - 1.0f) * 8.0f));
  if (steps == 8) {
    steps = 0;
    ++unbiased;
  }
  int code_exponent = unbiased + 7;
  if (code_exponent > 15 || (code_exponent == 15 && steps > 6)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((code_exponent << 3) | steps);
}

float e4m3_to_f32(uint8_t bits) {
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0x0F;
  const int mantissa = bits & 0x07;
  if (exponent == 15 && mantissa == 7) return std::copysign(NAN, sign);
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
}

uint8_t f32_to_e8m0(float value) {
  if (!(value > 0.0f)) return 0xFF;  // zero, negative and NaN have no e8m0 code
  if (std::isinf(value)) return 254;
  int exponent = 0;
  float fraction = std::frexp(value, &exponent);
  int unbiased = exponent - 1;
  float mantissa = fraction * 2.0f;  // value = mantissa * 2^unbiased, mantissa in [1,2)
  int code = unbiased + 127;
  // Nearest power of two in value: the midpoint between 2^u and 2^(u+1) is 1.5 * 2^u; a tie goes to the
  // even code.
  if (mantissa > 1.5f || (mantissa == 1.5f && (code & 1))) ++code;
  if (code < 0) return 0;
  if (code > 254) return 254;
  return static_cast<uint8_t>(code);
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

}  // namespace expar
