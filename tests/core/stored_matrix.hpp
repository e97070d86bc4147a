#pragma once
// A weight matrix in each stored format (core/weight_view.hpp) with random finite values, its scalar
// decoding and its dequantised copy: the operands of the stored-format product tests.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/random_vector.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/weight_view.hpp"

namespace expar::testing {

// A stored matrix [rows, cols] of row stride ld and the storage behind its view.
struct StoredMatrix {
  WeightFormat format;
  int64_t rows, cols, ld;
  std::vector<uint16_t> halves;  // BF16, F16
  std::vector<uint8_t> bytes;    // MXFP4 blocks, FP8 codes
  std::vector<uint8_t> e8m0;     // MXFP4 scales [rows, ld / 32]
  std::vector<float> floats;     // F32 values, FP8 multipliers [ceil(rows / 128), ceil(ld / 128)]

  int64_t scale_ld() const {
    return format == WeightFormat::MXFP4 ? ld / kMxfp4Block : (ld + kFp8Block - 1) / kFp8Block;
  }
  WeightView view() const {
    switch (format) {
      case WeightFormat::F32:
        return WeightView::f32(floats.data(), rows, cols, ld);
      case WeightFormat::BF16:
        return WeightView::bf16(halves.data(), rows, cols, ld);
      case WeightFormat::F16:
        return WeightView::f16(halves.data(), rows, cols, ld);
      case WeightFormat::MXFP4:
        return WeightView::mxfp4(bytes.data(), e8m0.data(), rows, cols, ld, scale_ld());
      case WeightFormat::FP8:
        return WeightView::fp8(bytes.data(), floats.data(), rows, cols, ld, scale_ld());
    }
    return {};
  }
  // Element (r, c), decoded here from the scalar decoders.
  float value(int64_t r, int64_t c) const {
    const size_t i = static_cast<size_t>(r * ld + c);
    switch (format) {
      case WeightFormat::F32:
        return floats[i];
      case WeightFormat::BF16:
        return bf16_to_f32(halves[i]);
      case WeightFormat::F16:
        return f16_to_f32(halves[i]);
      case WeightFormat::MXFP4: {
        const uint8_t byte = bytes[i / 2];
        const uint8_t code = c % 2 ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0x0f);
        return e2m1_to_f32(code) * e8m0_to_f32(e8m0[static_cast<size_t>(r * scale_ld() + c / kMxfp4Block)]);
      }
      case WeightFormat::FP8:
        return e4m3_to_f32(bytes[i]) *
               floats[static_cast<size_t>(r / kFp8Block * scale_ld() + c / kFp8Block)];
    }
    return 0.0f;
  }
};

inline uint32_t random_bits(uint64_t seed, uint64_t i) {
  return static_cast<uint32_t>(std::fabs(random_normal(seed, 77, i)) * 1e9);
}

// Random finite values of the format, about N(0, 1) in size.
inline StoredMatrix random_matrix(WeightFormat format, int64_t rows, int64_t cols, int64_t ld,
                                  uint64_t seed) {
  StoredMatrix m{format, rows, cols, ld, {}, {}, {}, {}};
  const size_t n = static_cast<size_t>(rows * ld);
  switch (format) {
    case WeightFormat::F32:
      m.floats = random_vector(n, seed, 1);
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      for (size_t i = 0; i < n; ++i) {
        const float v = random_normal(seed, 2, i);
        m.halves.push_back(format == WeightFormat::BF16 ? f32_to_bf16(v) : f32_to_f16(v));
      }
      break;
    case WeightFormat::MXFP4:
      for (size_t i = 0; i < n / 2; ++i) m.bytes.push_back(static_cast<uint8_t>(random_bits(seed, i)));
      for (size_t i = 0; i < static_cast<size_t>(rows * m.scale_ld()); ++i)
        m.e8m0.push_back(static_cast<uint8_t>(122 + random_bits(seed + 1, i) % 8));  // 2^-5 .. 2^2
      break;
    case WeightFormat::FP8:
      for (size_t i = 0; i < n; ++i) {
        uint8_t code = static_cast<uint8_t>(random_bits(seed, i));
        if ((code & 0x7f) == 0x7f) code = static_cast<uint8_t>(code - 1);  // no NaN
        m.bytes.push_back(code);
      }
      for (size_t i = 0; i < static_cast<size_t>((rows + kFp8Block - 1) / kFp8Block * m.scale_ld()); ++i)
        m.floats.push_back(0.01f * (1.0f + std::fabs(random_normal(seed + 1, 3, i))));  // not powers of two
      break;
  }
  return m;
}

inline std::vector<float> dequantised(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  dequantize_rows(w, 0, w.rows, out.data(), w.cols);
  return out;
}

}  // namespace expar::testing
