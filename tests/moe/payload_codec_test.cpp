#include "expar/moe/payload_codec.hpp"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar {
namespace {

std::vector<float> round_trip(PayloadFormat format, const std::vector<float>& x, int64_t d) {
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  std::vector<std::byte> wire(static_cast<size_t>(rows) * payload_row_bytes(format, d));
  encode_payload_rows(format, x.data(), rows, d, wire.data());
  std::vector<float> back(x.size(), -12345.0f);
  decode_payload_rows(format, wire.data(), rows, d, back.data());
  return back;
}

float uniform(uint64_t seed, uint64_t i) {
  return random_uniform(seed, 0, i);
}

// A finite E4M3 code drawn at random (never the NaN codes 0x7F / 0xFF).
uint8_t random_finite_e4m3(uint64_t seed, uint64_t i) {
  uint8_t c = static_cast<uint8_t>(random_u32(seed, 1, i) & 0xFF);
  return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c - 1) : c;
}

std::vector<uint8_t> encode_block(const std::vector<float>& block, MxScaleRule rule, uint8_t& scale) {
  std::vector<uint8_t> elements(block.size());
  scale = mx_encode_block(block, rule, elements);
  return elements;
}

std::vector<float> decode_block(const std::vector<uint8_t>& elements, uint8_t scale) {
  std::vector<float> out(elements.size());
  mx_decode_block(elements, scale, out);
  return out;
}

// Encode then decode one block; `scale` receives the block's scale code.
std::vector<float> quantize(const std::vector<float>& block, MxScaleRule rule, uint8_t& scale) {
  const auto elements = encode_block(block, rule, scale);
  return decode_block(elements, scale);
}

TEST(PayloadCodec, RowBytesPerFormat) {
  EXPECT_EQ(payload_row_bytes(PayloadFormat::F32, 1024), 4096u);
  EXPECT_EQ(payload_row_bytes(PayloadFormat::BF16, 1024), 2048u);
  EXPECT_EQ(payload_row_bytes(PayloadFormat::MXFP8, 1024), 1024u + 32u);
  EXPECT_EQ(payload_row_bytes(PayloadFormat::MXFP8Floor, 64), 66u);
  EXPECT_EQ(payload_row_bytes(PayloadFormat::BF16, 1000), 2000u);  // no block rule for bf16
  EXPECT_THROW(payload_row_bytes(PayloadFormat::F32, 0), Error);
}

TEST(PayloadCodec, MxWidthNotMultipleOf32IsAClearError) {
  try {
    payload_row_bytes(PayloadFormat::MXFP8, 1000);
    FAIL() << "d=1000 accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("d=1000"), std::string::npos) << m;
    EXPECT_NE(m.find("multiple of the MX block size 32"), std::string::npos) << m;
    EXPECT_NE(m.find("1024"), std::string::npos) << m;  // the padded width it suggests
  }
  std::vector<float> x(1000, 1.0f);
  std::vector<std::byte> wire(4000);
  EXPECT_THROW(encode_payload_rows(PayloadFormat::MXFP8, x.data(), 1, 1000, wire.data()), Error);
  EXPECT_THROW(decode_payload_rows(PayloadFormat::MXFP8, wire.data(), 1, 1000, x.data()), Error);
}

TEST(PayloadCodec, FormatNames) {
  for (PayloadFormat f : payload_formats()) EXPECT_EQ(payload_format_from_name(payload_format_name(f)), f);
  EXPECT_EQ(payload_format_name(PayloadFormat::MXFP8), "mxfp8");
  EXPECT_THROW(payload_format_from_name("fp8"), Error);
}

TEST(PayloadCodec, F32IsTheIdentityBitForBit) {
  const int64_t d = 48;
  std::vector<float> x(3 * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(random_u32(5, 0, i));  // NaNs too
  const auto back = round_trip(PayloadFormat::F32, x, d);
  EXPECT_EQ(std::memcmp(back.data(), x.data(), x.size() * sizeof(float)), 0);
}

TEST(PayloadCodec, Bf16RoundTripsRepresentableValuesExactly) {
  const int64_t d = 40;
  std::vector<float> x(5 * d);
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t bits = static_cast<uint16_t>(random_u32(6, 0, i) & 0xFFFF);
    if ((bits & 0x7F80) == 0x7F80) bits &= 0xBFFF;  // keep it finite
    x[i] = bf16_to_f32(bits);
  }
  const auto back = round_trip(PayloadFormat::BF16, x, d);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(x[i]));
}

TEST(PayloadCodec, Bf16RelativeErrorAtMost2ToMinus8) {
  const int64_t d = 64;
  std::vector<float> x(64 * d);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = (uniform(7, i) - 0.5f) * std::ldexp(1.0f, static_cast<int>(random_u32(7, 2, i) % 80) - 40);
  const auto back = round_trip(PayloadFormat::BF16, x, d);
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 0.0f) continue;
    const double rel = std::fabs(double(back[i]) - double(x[i])) / std::fabs(double(x[i]));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 0x1p-8) << "x=" << x[i];
  }
  EXPECT_GT(worst, 0x1p-10);  // the data is not accidentally exact
}

// The codec's inlined conversions give the same bits as core/convert.hpp's scalar ones.
TEST(PayloadCodec, Bf16EncodeMatchesTheScalarConversionBitForBit) {
  std::vector<float> x;
  for (uint64_t i = 0; i < (1u << 18); ++i) x.push_back(std::bit_cast<float>(random_u32(21, 0, i)));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, -0x1p-149f,
                  std::numeric_limits<float>::max(), std::bit_cast<float>(0x3F808000u),  // tie -> even (down)
                  std::bit_cast<float>(0x3F818000u), std::bit_cast<float>(0x7F7F8000u)})  // tie up; overflow
    x.push_back(v);
  x.resize((x.size() + 31) / 32 * 32, 1.0f);
  std::vector<std::byte> wire(x.size() * 2);
  encode_payload_rows(PayloadFormat::BF16, x.data(), static_cast<int64_t>(x.size() / 32), 32, wire.data());
  std::vector<float> back(x.size());
  decode_payload_rows(PayloadFormat::BF16, wire.data(), static_cast<int64_t>(x.size() / 32), 32, back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t got = 0;
    std::memcpy(&got, wire.data() + 2 * i, 2);
    ASSERT_EQ(got, f32_to_bf16(x[i])) << "x bits " << std::bit_cast<uint32_t>(x[i]);
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(bf16_to_f32(got)));
  }
}

// Decoding to BF16 (the operand of a BF16 expert product) gives, element by element, core/convert.hpp's
// f32_to_bf16 of the f32 decode, for every format, with non-finite values, f32 subnormals and MX blocks so
// small that their elements are f32 subnormals below BF16's resolution; no element of the poisoned output is
// left unwritten.
TEST(PayloadCodec, DecodeToBf16IsTheRoundingOfTheF32Decode) {
  constexpr int64_t d = 64, rows = 96;
  std::vector<float> x(static_cast<size_t>(rows * d));
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = 4.0f * (uniform(31, i) - 0.5f);
    const int64_t row = static_cast<int64_t>(i) / d;
    x[i] = row % 3 == 1 ? std::ldexp(v, -130) : row % 3 == 2 ? std::bit_cast<float>(random_u32(32, 0, i)) : v;
  }
  const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 0x1p-149f, -0.0f};
  for (size_t j = 0; j < std::size(specials); ++j) x[static_cast<size_t>(d * 6 + 7) + j] = specials[j];
  x[5] = NAN;
  x[d + 9] = -INFINITY;
  for (PayloadFormat format : payload_formats()) {
    SCOPED_TRACE(std::string(payload_format_name(format)));
    std::vector<std::byte> wire(static_cast<size_t>(rows) * payload_row_bytes(format, d));
    encode_payload_rows(format, x.data(), rows, d, wire.data());
    std::vector<float> f32(x.size());
    decode_payload_rows(format, wire.data(), rows, d, f32.data());
    std::vector<uint16_t> bf16(x.size(), 0x4049);  // 3.14: no decode here gives it
    decode_payload_rows_bf16(format, wire.data(), rows, d, bf16.data());
    int64_t inexact = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(f32[i])) {
        // A NaN block's sign is whichever NaN operand the decode's multiply returned (its loop's
        // vectorisation decides): only NaN-ness is the format's (payload_codec.hpp).
        ASSERT_TRUE(std::isnan(bf16_to_f32(bf16[i]))) << "element " << i;
        continue;
      }
      ASSERT_EQ(bf16[i], f32_to_bf16(f32[i]))
          << "element " << i << ", f32 decode bits " << std::bit_cast<uint32_t>(f32[i]);
      inexact += bf16_to_f32(bf16[i]) != f32[i];
    }
    if (format == PayloadFormat::F32) {
      EXPECT_GT(inexact, 0);  // the test rounds, not only copies
    }
  }
}

TEST(MxScale, ElementsMatchTheScalarConversionOfTheScaledValue) {
  // Reference: f32_to_e4m3(ldexp(v, -s)) with s from the scale code, for blocks whose elements sit on E4M3
  // values, on midpoints between them (ties), one ulp either side, in the subnormal range, and at random.
  for (MxScaleRule rule : {MxScaleRule::Ceil, MxScaleRule::Floor})
    for (uint64_t trial = 0; trial < 3000; ++trial) {
      const int s = static_cast<int>(random_u32(23, 0, trial) % 240) - 120;
      std::vector<float> block(32);
      for (size_t i = 0; i < 32; ++i) {
        const uint64_t at = trial * 32 + i;
        const uint8_t c = random_finite_e4m3(23, at);
        const float lo = e4m3_to_f32(c & 0x7F),
                    hi = e4m3_to_f32(static_cast<uint8_t>(std::min(0x7E, (c & 0x7F) + 1)));
        float v = 0.0f;
        switch (random_u32(23, 2, at) % 5) {
          case 0:
            v = lo;
            break;
          case 1:
            v = 0.5f * (lo + hi);
            break;
          case 2:
            v = std::nextafter(0.5f * (lo + hi), 0.0f);
            break;
          case 3:
            v = std::nextafter(0.5f * (lo + hi), 1000.0f);
            break;
          default:
            v = random_uniform(23, 3, at) * 512.0f;
            break;
        }
        block[i] = std::ldexp((c & 0x80) ? -v : v, s);
      }
      std::vector<uint8_t> elements(32);
      const uint8_t scale = mx_encode_block(block, rule, elements);
      ASSERT_NE(scale, 0xFF);
      for (size_t i = 0; i < 32; ++i)
        ASSERT_EQ(elements[i], f32_to_e4m3(std::ldexp(block[i], 127 - static_cast<int>(scale))))
            << "trial " << trial << " i " << i << " value " << block[i] << " scale " << int(scale);
    }
}

TEST(MxScale, HandComputedBlocks) {
  for (MxScaleRule rule : {MxScaleRule::Floor, MxScaleRule::Ceil}) {
    // max 1.0: floor(log2 1) - 8 = -8 -> code 119; 1 / 2^-8 = 256 <= 448, so Ceil agrees.
    EXPECT_EQ(mx_block_scale(std::vector<float>(32, 1.0f), rule), 119);
    // max 448 = 1.75 * 2^8: s = 0 under both rules, code 127, and 448 itself is exact.
    std::vector<float> b(32, 0.5f);
    b[7] = -448.0f;
    EXPECT_EQ(mx_block_scale(b, rule), 127);
    // max 2^-120 (normal): floor gives s = -128, below the E8M0 range, so s = -127 (code 0).
    EXPECT_EQ(mx_block_scale(std::vector<float>(32, 0x1p-120f), rule), 0);
    // f32 subnormals only: clamped to code 0 as well.
    EXPECT_EQ(mx_block_scale(std::vector<float>(32, 0x1p-149f), rule), 0);
    // All zero (with negative zeros): code 0.
    std::vector<float> z(32, 0.0f);
    z[3] = -0.0f;
    EXPECT_EQ(mx_block_scale(z, rule), 0);
    // One huge value among ones: 1e30 = 0.7889 * 2^100 -> s = 100 - 9 = 91 (code 218) under both rules.
    std::vector<float> h(32, 1.0f);
    h[31] = 1e30f;
    EXPECT_EQ(mx_block_scale(h, rule), 218);
    // NaN or +-inf anywhere: the E8M0 NaN code.
    std::vector<float> n(32, 1.0f);
    n[5] = NAN;
    EXPECT_EQ(mx_block_scale(n, rule), 0xFF);
    n[5] = -INFINITY;
    EXPECT_EQ(mx_block_scale(n, rule), 0xFF);
  }
  // max 449 = 0.877 * 2^9: Floor keeps s = 0 (449 saturates to 448); Ceil takes s = 1.
  std::vector<float> b(32, 1.0f);
  b[0] = 449.0f;
  EXPECT_EQ(mx_block_scale(b, MxScaleRule::Floor), 127);
  EXPECT_EQ(mx_block_scale(b, MxScaleRule::Ceil), 128);
  // The largest f32: 0.99999994 * 2^128 -> Floor s = 119 (code 246), Ceil s = 120 (code 247).
  std::vector<float> m(32, 1.0f);
  m[1] = std::numeric_limits<float>::max();
  EXPECT_EQ(mx_block_scale(m, MxScaleRule::Floor), 246);
  EXPECT_EQ(mx_block_scale(m, MxScaleRule::Ceil), 247);
}

TEST(MxScale, SpecialBlocksEncodeAndDecodeAsDocumented) {
  uint8_t scale = 0;
  // All zero: elements keep the sign of zero and decode to the same zeros.
  std::vector<float> z(32, 0.0f);
  z[9] = -0.0f;
  auto ez = encode_block(z, MxScaleRule::Ceil, scale);
  EXPECT_EQ(scale, 0);
  EXPECT_EQ(ez[9], 0x80);
  EXPECT_EQ(ez[0], 0x00);
  auto dz = decode_block(ez, scale);
  for (size_t i = 0; i < z.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(dz[i]), std::bit_cast<uint32_t>(z[i]));

  // One huge value: it survives within 2^-4, the ones vanish below the E4M3 resolution at that scale.
  std::vector<float> h(32, 1.0f);
  h[31] = 1e30f;
  auto dh = quantize(h, MxScaleRule::Ceil, scale);
  EXPECT_NEAR(dh[31], 1e30f, 1e30f * 0x1p-4f);
  EXPECT_EQ(dh[0], 0.0f);

  // Subnormal inputs: 2^-149 is far below 2^-127 * 2^-9 and decodes to zero; 2^-120 round-trips.
  auto ds = quantize(std::vector<float>(32, 0x1p-149f), MxScaleRule::Ceil, scale);
  EXPECT_EQ(ds[0], 0.0f);
  std::vector<float> tiny(32, 0x1p-120f);
  tiny[2] = 0x1.8p-125f;  // 0.75 * 2^-124 relative to scale 2^-127 = 6.0: exact in E4M3
  auto dt = quantize(tiny, MxScaleRule::Ceil, scale);
  EXPECT_EQ(dt[0], 0x1p-120f);
  EXPECT_EQ(dt[2], 0x1.8p-125f);

  // NaN or inf: the whole block decodes to NaN, nothing is made finite.
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> n(32, 2.0f);
    n[4] = bad;
    auto en = encode_block(n, MxScaleRule::Ceil, scale);
    EXPECT_EQ(scale, 0xFF);
    for (float v : decode_block(en, scale)) EXPECT_TRUE(std::isnan(v));
  }
}

TEST(MxScale, CeilRoundTripsEveryBlockOfScaledE4M3Values) {
  // Any block of finite E4M3 values times 2^s (s in the E8M0 range, the product finite) is representable, and
  // the Ceil rule finds a scale that represents it exactly.
  for (uint64_t trial = 0; trial < 400; ++trial) {
    // s up to 119 keeps 448 * 2^s finite in f32 (2^120 * 448 would overflow).
    const int s = static_cast<int>(random_u32(11, trial, 999) % 247) - 127;
    std::vector<float> block(32);
    for (size_t i = 0; i < 32; ++i)
      block[i] = std::ldexp(e4m3_to_f32(random_finite_e4m3(11, trial * 32 + i)), s);
    uint8_t scale = 0;
    const auto back = quantize(block, MxScaleRule::Ceil, scale);
    for (size_t i = 0; i < 32; ++i) {
      if (block[i] == 0.0f) {
        EXPECT_EQ(back[i], 0.0f);
      } else {
        EXPECT_EQ(back[i], block[i]) << "trial " << trial << " i " << i << " s " << s;
      }
    }
  }
}

TEST(MxScale, FloorSaturatesWhereCeilIsExact) {
  // 240 = 1.875 * 2^7 is an E4M3 value. Floor picks s = 7 - 8 = -1, so 240 / 2^-1 = 480 saturates to 448
  // and decodes to 224 (error 16/240 > 2^-4); Ceil picks s = 0 and keeps 240.
  std::vector<float> b(32, 3.0f);
  b[0] = 240.0f;
  uint8_t scale = 0;
  auto floor_back = quantize(b, MxScaleRule::Floor, scale);
  EXPECT_EQ(scale, 126);
  EXPECT_EQ(floor_back[0], 224.0f);
  EXPECT_EQ(floor_back[1], 3.0f);
  auto ceil_back = quantize(b, MxScaleRule::Ceil, scale);
  EXPECT_EQ(scale, 127);
  EXPECT_EQ(ceil_back[0], 240.0f);
  EXPECT_EQ(ceil_back[1], 3.0f);
}

TEST(PayloadCodec, MxErrorWithin2ToMinus4OfBlockMax) {
  const int64_t d = 256, rows = 32;
  std::vector<float> x(static_cast<size_t>(rows * d));
  // Magnitudes vary by block (2^-60 .. 2^60) and within a block (a factor up to 2^12), signs mixed.
  for (size_t i = 0; i < x.size(); ++i) {
    const int block_exp = static_cast<int>(random_u32(13, 0, i / 32) % 121) - 60;
    const int inner = -static_cast<int>(random_u32(13, 1, i) % 13);
    x[i] = (uniform(13, i) * 2.0f - 1.0f) * std::ldexp(1.0f, block_exp + inner);
  }
  double worst_ceil = 0.0, worst_floor = 0.0;
  for (PayloadFormat f : {PayloadFormat::MXFP8, PayloadFormat::MXFP8Floor}) {
    const auto back = round_trip(f, x, d);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float max_abs = 0.0f;
      for (size_t i = b * 32; i < b * 32 + 32; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
      for (size_t i = b * 32; i < b * 32 + 32; ++i) {
        const double rel = std::fabs(double(back[i]) - double(x[i])) / double(max_abs);
        if (f == PayloadFormat::MXFP8) {
          worst_ceil = std::max(worst_ceil, rel);
          EXPECT_LE(rel, 0x1p-4) << "block " << b << " x=" << x[i] << " back=" << back[i];
        } else {
          worst_floor = std::max(worst_floor, rel);
          EXPECT_LE(rel, 0x1p-3) << "block " << b;  // saturation loses at most 1/8 of the value
        }
      }
    }
  }
  EXPECT_GT(worst_ceil, 0x1p-7);   // quantization did happen
  EXPECT_GT(worst_floor, 0x1p-4);  // and the OCP reference rule does saturate on this data
}

TEST(PayloadCodec, MxRowLayoutIsElementsThenScales) {
  const int64_t d = 64, rows = 3;
  std::vector<float> x(static_cast<size_t>(rows * d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = (uniform(17, i) - 0.5f) * static_cast<float>(1 + i);
  const size_t row_bytes = payload_row_bytes(PayloadFormat::MXFP8, d);
  std::vector<std::byte> wire(rows * row_bytes);
  encode_payload_rows(PayloadFormat::MXFP8, x.data(), rows, d, wire.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < d / 32; ++b) {
      const float* block = x.data() + r * d + b * 32;
      std::array<uint8_t, 32> elements{};
      const uint8_t scale = mx_encode_block(std::span<const float>(block, 32), MxScaleRule::Ceil, elements);
      const auto* row = reinterpret_cast<const uint8_t*>(wire.data() + static_cast<size_t>(r) * row_bytes);
      EXPECT_EQ(row[d + b], scale) << r << " " << b;
      EXPECT_EQ(std::memcmp(row + b * 32, elements.data(), 32), 0) << r << " " << b;
    }
  // Decoding the rows equals decoding every block on its own.
  std::vector<float> back(x.size());
  decode_payload_rows(PayloadFormat::MXFP8, wire.data(), rows, d, back.data());
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = reinterpret_cast<const uint8_t*>(wire.data() + static_cast<size_t>(r) * row_bytes);
    for (int64_t b = 0; b < d / 32; ++b) {
      std::array<float, 32> expect{};
      mx_decode_block(std::span<const uint8_t>(row + b * 32, 32), row[d + b], expect);
      for (int i = 0; i < 32; ++i) EXPECT_EQ(back[static_cast<size_t>(r * d + b * 32 + i)], expect[i]);
    }
  }
}

TEST(PayloadCodec, ZeroRowsIsANoOpAndBadArgumentsThrow) {
  std::vector<std::byte> wire(8, std::byte{0x5A});
  encode_payload_rows(PayloadFormat::MXFP8, nullptr, 0, 32, nullptr);
  EXPECT_THROW(encode_payload_rows(PayloadFormat::BF16, nullptr, 2, 32, wire.data()), Error);
  float x[32] = {};
  EXPECT_THROW(encode_payload_rows(PayloadFormat::BF16, x, -1, 32, wire.data()), Error);
  std::vector<uint8_t> elements(31);
  EXPECT_THROW(mx_encode_block(std::span<const float>(x, 32), MxScaleRule::Ceil, elements), Error);
  EXPECT_THROW(mx_block_scale(std::span<const float>(), MxScaleRule::Ceil), Error);
}

}  // namespace
}  // namespace expar
