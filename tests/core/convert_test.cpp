#include "expar/core/convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>

namespace expar {
namespace {

TEST(E4M3, EveryCodeDecodesAndRoundTrips) {
  int nan_codes = 0;
  for (int code = 0; code < 256; ++code) {
    auto bits = static_cast<uint8_t>(code);
    float v = e4m3_to_f32(bits);
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << code;
      ++nan_codes;
      continue;
    }
    EXPECT_FALSE(std::isinf(v)) << code;
    EXPECT_LE(std::fabs(v), 448.0f) << code;
    uint8_t back = f32_to_e4m3(v);
    if (v == 0.0f) {
      EXPECT_EQ(back & 0x7F, 0) << code;
    } else {
      EXPECT_EQ(back, bits) << code << " value " << v;
    }
  }
  EXPECT_EQ(nan_codes, 2);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);  // smallest normal
}

TEST(E4M3, SaturatesAndRoundsToNearestEven) {
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7E);
  // 1.0625 is halfway between 1.0 (mantissa 0, even) and 1.125 (mantissa 1): ties to even -> 1.0.
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);
  // 1.1875 is halfway between 1.125 (odd) and 1.25 (even) -> 1.25.
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.1875f)), 1.25f);
  // Subnormal tie: 1.5 * 2^-9 lies between codes 1 and 2 -> 2 (even).
  EXPECT_EQ(f32_to_e4m3(1.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(f32_to_e4m3(0.5f * 0x1p-9f), 0x00);  // tie between 0 and the smallest subnormal -> 0
  // Every midpoint between adjacent positive finite codes rounds to the even code.
  for (int code = 0; code < 0x7E; ++code) {
    float lo = e4m3_to_f32(static_cast<uint8_t>(code)), hi = e4m3_to_f32(static_cast<uint8_t>(code + 1));
    float mid = 0.5f * (lo + hi);
    uint8_t expect = (code % 2 == 0) ? static_cast<uint8_t>(code) : static_cast<uint8_t>(code + 1);
    EXPECT_EQ(f32_to_e4m3(mid), expect) << "midpoint after code " << code;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), code) << code;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), code + 1) << code;
  }
}

TEST(E8M0, EveryCode) {
  for (int code = 0; code < 256; ++code) {
    float v = e8m0_to_f32(static_cast<uint8_t>(code));
    if (code == 0xFF) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(v, std::ldexp(1.0f, code - 127)) << code;
    EXPECT_GT(v, 0.0f);
    EXPECT_EQ(f32_to_e8m0(v), code) << code;
  }
  EXPECT_EQ(f32_to_e8m0(0.0f), 0xFF);
  EXPECT_EQ(f32_to_e8m0(-1.0f), 0xFF);
  EXPECT_EQ(f32_to_e8m0(NAN), 0xFF);
  EXPECT_EQ(f32_to_e8m0(1.4f), 127);
  EXPECT_EQ(f32_to_e8m0(1.6f), 128);
  EXPECT_EQ(f32_to_e8m0(1.5f), 128);  // tie: code 127 is odd, so 128
  EXPECT_EQ(f32_to_e8m0(3.0f), 128);  // tie between 2 (code 128, even) and 4 (129)
}

TEST(BF16, RoundTripsAndTies) {
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    auto bits = static_cast<uint16_t>(hi);
    float v = bf16_to_f32(bits);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(v), bits) << hi;
  }
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f))), 1.0f + 0x1p-7f);
}

TEST(F16, RoundTrips) {
  for (uint32_t code = 0; code < 0x10000; ++code) {
    float v = f16_to_f32(static_cast<uint16_t>(code));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_f16(v), code);
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
}

}  // namespace
}  // namespace expar
