#include "expar/moe/payload_codec.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "expar/core/assert.hpp"
#include "expar/core/bf16_round.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"

namespace expar {

namespace {

constexpr uint8_t kE8M0NaN = 0xFF;
constexpr uint8_t kE4M3NaN = 0x7F;
constexpr int kMinScaleExponent = -127;  // E8M0 code 0
constexpr int kMaxScaleExponent = 127;   // E8M0 code 254

MxScaleRule rule_of(PayloadFormat format) {
  return format == PayloadFormat::MXFP8Floor ? MxScaleRule::Floor : MxScaleRule::Ceil;
}

// Exponent s of the shared scale 2^s for a block whose largest magnitude is max_abs (finite, >= 0).
int scale_exponent(float max_abs, MxScaleRule rule) {
  if (max_abs == 0.0f) return kMinScaleExponent;
  int e = 0;
  const float f = std::frexp(max_abs, &e);  // max_abs = f * 2^e, f in [0.5, 1)
  int s = e - 9;                            // floor(log2(max_abs)) - 8 (8: the largest E4M3 exponent)
  // 448 = 0.875 * 2^9, so max_abs <= 448 * 2^s holds for s = e - 9 iff f <= 0.875; otherwise Floor
  // saturates the largest elements and Ceil takes the next power of two.
  if (rule == MxScaleRule::Ceil && f > 0.875f) ++s;
  return std::clamp(s, kMinScaleExponent, kMaxScaleExponent);
}

// Block statistics in one pass: the largest magnitude and whether anything is NaN or infinite.
struct BlockMax {
  float max_abs = 0.0f;
  bool non_finite = false;
};

BlockMax block_max(std::span<const float> block) {
  BlockMax m;
  for (float v : block) {
    if (!std::isfinite(v)) m.non_finite = true;
    m.max_abs = std::max(m.max_abs, std::fabs(v));
  }
  return m;
}

// The per-element conversions of the hot loops, inlined and branch-free so that the compiler can vectorise
// them (BF16's is core/bf16_round.hpp's); they give the same bits as core/convert.hpp (f32_to_bf16,
// f32_to_e4m3), which the tests check.

// f32 -> E4M3 code for a finite value (the caller has excluded NaN and inf blocks), round to nearest even,
// saturating to ±448.
inline uint8_t e4m3_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  // Normal E4M3 (>= 2^-6): keep 3 of the 23 mantissa bits with round-to-nearest-even; a carry moves into the
  // exponent, which is what the format wants. E4M3 exponent = f32 exponent - 127 + 7.
  const uint32_t rounded = (magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20;
  const uint32_t normal = rounded - (120u << 3);
  // Subnormal E4M3 (< 2^-6): multiples of 2^-9; adding 2^23 rounds to an integer, ties to even.
  const float scaled = std::bit_cast<float>(magnitude) * 512.0f;
  const uint32_t sub = static_cast<uint32_t>((scaled + 8388608.0f) - 8388608.0f);
  uint32_t code = magnitude < 0x3C800000u ? sub : normal;  // 0x3C800000 = 2^-6
  code = std::min(code, 0x7Eu);  // saturate: 448 (also for values that round past it)
  return static_cast<uint8_t>(sign | code);
}

// E4M3 code -> value, for decoding without per-element branches.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

void check_rows(const void* src, const void* dst, int64_t rows, int64_t d) {
  EXPAR_ASSERT(rows >= 0, "rows={}: a payload needs a non-negative row count", rows);
  EXPAR_ASSERT(rows == 0 || (src != nullptr && dst != nullptr),
               "payload of {} rows x {} with a null source or destination: pass both buffers", rows, d);
}

}  // namespace

std::string_view payload_format_name(PayloadFormat format) {
  switch (format) {
    case PayloadFormat::F32:
      return "f32";
    case PayloadFormat::BF16:
      return "bf16";
    case PayloadFormat::MXFP8:
      return "mxfp8";
    case PayloadFormat::MXFP8Floor:
      return "mxfp8-floor";
  }
  fail("payload format {}: not a PayloadFormat value", static_cast<int>(format));
}

PayloadFormat payload_format_from_name(std::string_view name) {
  for (PayloadFormat f : payload_formats())
    if (payload_format_name(f) == name) return f;
  std::vector<std::string_view> names;
  for (PayloadFormat f : payload_formats()) names.push_back(payload_format_name(f));
  fail("payload format '{}' is unknown: choose one of {}", name, fmt::join(names, ", "));
}

std::vector<PayloadFormat> payload_formats() {
  return {PayloadFormat::F32, PayloadFormat::BF16, PayloadFormat::MXFP8, PayloadFormat::MXFP8Floor};
}

size_t payload_row_bytes(PayloadFormat format, int64_t d) {
  EXPAR_ASSERT(d >= 1, "d={}: a payload row needs at least 1 element", d);
  const auto n = static_cast<size_t>(d);
  switch (format) {
    case PayloadFormat::F32:
      return 4 * n;
    case PayloadFormat::BF16:
      return 2 * n;
    case PayloadFormat::MXFP8:
    case PayloadFormat::MXFP8Floor:
      EXPAR_CHECK(d % kMxBlockSize == 0,
                  "d={} is not a multiple of the MX block size {}: {} payloads share one scale per {} "
                  "elements along d; use f32 or bf16 for this width, or pad d to {}",
                  d, kMxBlockSize, payload_format_name(format), kMxBlockSize,
                  (d + kMxBlockSize - 1) / kMxBlockSize * kMxBlockSize);
      return n + n / static_cast<size_t>(kMxBlockSize);
  }
  fail("payload format {}: not a PayloadFormat value", static_cast<int>(format));
}

uint8_t mx_block_scale(std::span<const float> block, MxScaleRule rule) {
  EXPAR_ASSERT(!block.empty(), "an MX block of 0 elements has no scale: pass at least one element");
  const BlockMax m = block_max(block);
  if (m.non_finite) return kE8M0NaN;
  return static_cast<uint8_t>(scale_exponent(m.max_abs, rule) + 127);
}

uint8_t mx_encode_block(std::span<const float> block, MxScaleRule rule, std::span<uint8_t> elements) {
  EXPAR_ASSERT(elements.size() == block.size(),
               "MX block of {} values but {} element slots: pass equal lengths", block.size(),
               elements.size());
  const uint8_t scale = mx_block_scale(block, rule);
  if (scale == kE8M0NaN) {
    for (size_t i = 0; i < block.size(); ++i)
      elements[i] = static_cast<uint8_t>((std::signbit(block[i]) ? 0x80 : 0x00) | kE4M3NaN);
    return scale;
  }
  // Dividing by a power of two is exact (scaling up, or down into the f32 subnormals only for elements far
  // below the E4M3 resolution), so each element is rounded once, to E4M3.
  // 1 / X = 2^(127 - code) is exactly a float for every code 0..254 (2^-127 as a subnormal), and a product
  // with a power of two is rounded once, as ldexp(value, 127 - code) would be.
  const float inverse = std::ldexp(1.0f, 127 - static_cast<int>(scale));
  for (size_t i = 0; i < block.size(); ++i) elements[i] = e4m3_bits(block[i] * inverse);
  return scale;
}

void mx_decode_block(std::span<const uint8_t> elements, uint8_t scale, std::span<float> out) {
  EXPAR_ASSERT(elements.size() == out.size(),
               "MX block of {} elements but {} output slots: pass equal lengths", elements.size(),
               out.size());
  const auto& table = e4m3_table();
  // e8m0_to_f32 is NaN for 0xFF, so a NaN scale makes every element NaN. The product is exact: E4M3
  // values are multiples of 2^-9 with 4 significant bits and 2^-127 * 2^-9 is still above the f32
  // subnormal resolution 2^-149.
  const float x = e8m0_to_f32(scale);
  for (size_t i = 0; i < elements.size(); ++i) out[i] = table[elements[i]] * x;
}

void encode_payload_rows(PayloadFormat format, const float* src, int64_t rows, int64_t d, std::byte* dst) {
  const size_t row_bytes = payload_row_bytes(format, d);
  check_rows(src, dst, rows, d);
  const auto n = static_cast<size_t>(d);
  const auto total = static_cast<size_t>(rows) * n;
  switch (format) {
    case PayloadFormat::F32:
      if (total > 0) std::memcpy(dst, src, total * sizeof(float));
      return;
    case PayloadFormat::BF16:
      for (size_t i = 0; i < total; ++i) {
        const uint16_t bits = round_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
    case PayloadFormat::MXFP8:
    case PayloadFormat::MXFP8Floor: {
      const MxScaleRule rule = rule_of(format);
      const size_t blocks = n / static_cast<size_t>(kMxBlockSize);
      for (int64_t r = 0; r < rows; ++r) {
        const float* in = src + static_cast<size_t>(r) * n;
        auto* out = reinterpret_cast<uint8_t*>(dst + static_cast<size_t>(r) * row_bytes);
        for (size_t b = 0; b < blocks; ++b) {
          const size_t at = b * kMxBlockSize;
          out[n + b] = mx_encode_block(std::span<const float>(in + at, kMxBlockSize), rule,
                                       std::span<uint8_t>(out + at, kMxBlockSize));
        }
      }
      return;
    }
  }
}

void decode_payload_rows(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d, float* dst) {
  const size_t row_bytes = payload_row_bytes(format, d);
  check_rows(src, dst, rows, d);
  const auto n = static_cast<size_t>(d);
  const auto total = static_cast<size_t>(rows) * n;
  switch (format) {
    case PayloadFormat::F32:
      if (total > 0) std::memcpy(dst, src, total * sizeof(float));
      return;
    case PayloadFormat::BF16:
      for (size_t i = 0; i < total; ++i) {
        uint16_t bits = 0;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = widen_bf16(bits);
      }
      return;
    case PayloadFormat::MXFP8:
    case PayloadFormat::MXFP8Floor: {
      const size_t blocks = n / static_cast<size_t>(kMxBlockSize);
      for (int64_t r = 0; r < rows; ++r) {
        const auto* in = reinterpret_cast<const uint8_t*>(src + static_cast<size_t>(r) * row_bytes);
        float* out = dst + static_cast<size_t>(r) * n;
        for (size_t b = 0; b < blocks; ++b) {
          const size_t at = b * kMxBlockSize;
          mx_decode_block(std::span<const uint8_t>(in + at, kMxBlockSize), in[n + b],
                          std::span<float>(out + at, kMxBlockSize));
        }
      }
      return;
    }
  }
}

void decode_payload_rows_bf16(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d,
                              uint16_t* dst) {
  const size_t row_bytes = payload_row_bytes(format, d);
  check_rows(src, dst, rows, d);
  const auto n = static_cast<size_t>(d);
  if (format == PayloadFormat::BF16) {
    if (rows > 0) std::memcpy(dst, src, static_cast<size_t>(rows) * row_bytes);
    return;
  }
  // The f32 row, decoded in cache, then rounded: round_to_bf16(decoded value), whatever the format.
  std::vector<float> row(n);
  for (int64_t r = 0; r < rows; ++r) {
    decode_payload_rows(format, src + static_cast<size_t>(r) * row_bytes, 1, d, row.data());
    uint16_t* out = dst + static_cast<size_t>(r) * n;
    for (size_t i = 0; i < n; ++i) out[i] = round_to_bf16(row[i]);
  }
}

}  // namespace expar
