#include "expar/moe/payload_codec.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

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
  EXPAR_CHECK(rows >= 0, "rows={}: a payload needs a non-negative row count", rows);
  EXPAR_CHECK(rows == 0 || (src != nullptr && dst != nullptr),
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
  fail("payload format '{}' is unknown: choose f32, bf16, mxfp8 or mxfp8-floor", name);
}

std::vector<PayloadFormat> payload_formats() {
  return {PayloadFormat::F32, PayloadFormat::BF16, PayloadFormat::MXFP8, PayloadFormat::MXFP8Floor};
}

size_t payload_row_bytes(PayloadFormat format, int64_t d) {
  EXPAR_CHECK(d >= 1, "d={}: a payload row needs at least 1 element", d);
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
  EXPAR_CHECK(!block.empty(), "an MX block of 0 elements has no scale: pass at least one element");
  const BlockMax m = block_max(block);
  if (m.non_finite) return kE8M0NaN;
  return static_cast<uint8_t>(scale_exponent(m.max_abs, rule) + 127);
}

uint8_t mx_encode_block(std::span<const float> block, MxScaleRule rule, std::span<uint8_t> elements) {
  EXPAR_CHECK(elements.size() == block.size(),
              "MX block of {} values but {} element slots: pass equal lengths", block.size(),
              elements.size());
  const uint8_t scale = mx_block_scale(block, rule);
  if (scale == kE8M0NaN) {
    for (size_t i = 0; i < block.size(); ++i)
      elements[i] = static_cast<uint8_t>((std::signbit(block[i]) ? 0x80 : 0x00) | kE4M3NaN);
    return scale;
  }
  // Dividing by a power of two is exact (scaling up, or down into the f32 subnormals only for elements far
  // below the E4M3 resolution), so each element is rounded once, by f32_to_e4m3.
  const int shift = -(static_cast<int>(scale) - 127);
  for (size_t i = 0; i < block.size(); ++i) elements[i] = f32_to_e4m3(std::ldexp(block[i], shift));
  return scale;
}

void mx_decode_block(std::span<const uint8_t> elements, uint8_t scale, std::span<float> out) {
  EXPAR_CHECK(elements.size() == out.size(),
              "MX block of {} elements but {} output slots: pass equal lengths", elements.size(), out.size());
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
        const uint16_t bits = f32_to_bf16(src[i]);
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
        dst[i] = bf16_to_f32(bits);
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

}  // namespace expar
