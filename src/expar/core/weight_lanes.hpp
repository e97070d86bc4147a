#pragma once
// Internal to core/: the stored weight formats (core/weight_view.hpp) widened in registers to the exact f32
// values they stand for, sixteen at a time, in GCC's vector extension (AVX-512 one register, AVX2 two; the
// table lookups by intrinsics where the instruction set has them). core/matvec reads its weights through
// these and dequantize_rows writes them, so the two can never disagree. Each must equal the scalar decoder of
// core/convert.hpp bit for bit (tests/core/weight_formats_test checks every code).
#include <immintrin.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "expar/core/convert.hpp"
#include "expar/core/weight_view.hpp"

namespace expar::weight_lanes {

using Lanes = float __attribute__((vector_size(64), aligned(4)));
using Ints = int32_t __attribute__((vector_size(64), aligned(4)));
using Halves = uint16_t __attribute__((vector_size(32), aligned(2)));
constexpr int64_t kLanes = 16;

#if defined(__AVX512F__)
// Every lane. The AVX-512 intrinsics below are the zero-masking forms with all lanes set: the same
// instructions, but GCC 12's unmasked forms start from an "undefined" register that its
// -Wmaybe-uninitialized reports (GCC bug 105593), which -Werror turns into a failed build.
constexpr __mmask16 kAll = 0xFFFF;
#endif

// Every function writes its lanes through a reference: a 64-byte vector returned by value changes the ABI
// where AVX-512 is off (the debug build has no -march), which GCC warns about (-Wpsabi).

template <typename To, typename From>
inline void copy_bits(const From& from, To& to) {
  static_assert(sizeof(To) == sizeof(From));
  std::memcpy(&to, &from, sizeof to);
}

// BF16 is the upper half of an f32. Under AVX-512 one widening instruction: GCC lowers the generic
// conversion below as two half-width widenings joined by two more shuffles, all on the one shuffle port.
inline void widen_bf16(const uint16_t* p, Lanes& w) {
#if defined(__AVX512F__)
  const __m512i bits = _mm512_maskz_slli_epi32(
      kAll, _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  copy_bits(bits, w);
#else
  Halves h;
  std::memcpy(&h, p, sizeof h);
  const Ints bits = __builtin_convertvector(h, Ints) << 16;
  copy_bits(bits, w);
#endif
}

inline void widen_f16(const uint16_t* p, Lanes& w) {
#if defined(__AVX512F__)
  const __m512 v = _mm512_maskz_cvtph_ps(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  copy_bits(v, w);
#elif defined(__F16C__)
  const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  std::memcpy(&w, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&w) + sizeof lo, &hi, sizeof hi);
#else
  for (int64_t l = 0; l < kLanes; ++l) w[l] = f16_to_f32(p[l]);
#endif
}

// Sixteen bytes zero-extended to 32-bit lanes (GCC 12 lowers __builtin_convertvector of bytes to ints one
// byte at a time).
inline void widen_bytes(const uint8_t* p, Ints& v) {
#if defined(__AVX512F__)
  const __m512i wide = _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  copy_bits(wide, v);
#elif defined(__AVX2__)
  for (int h = 0; h < 2; ++h) {
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
    std::memcpy(reinterpret_cast<char*>(&v) + h * sizeof wide, &wide, sizeof wide);
  }
#else
  for (int64_t l = 0; l < kLanes; ++l) v[l] = p[l];
#endif
}

// E4M3 without subnormal f32 arithmetic (slow on some cores, flushed under DAZ): a normal code's bits are
// its exponent and mantissa moved into place with the bias difference (127 − 7) added; a subnormal code
// (exponent 0) is its mantissa times 2^-9, converted from the integer. The NaN codes S.1111.111 stay NaN.
inline void widen_e4m3(const uint8_t* p, Lanes& w) {
  Ints v;
  widen_bytes(p, v);
  const Ints magnitude = v & 0x7f;
  const Ints normal = (magnitude << 20) + (120 << 23);
  const Lanes subnormal = __builtin_convertvector(v & 0x07, Lanes) * 0x1p-9f;
  Ints subnormal_bits;
  copy_bits(subnormal, subnormal_bits);
  const Ints is_subnormal = (v & 0x78) == 0;  // all ones where true
  Ints bits = (normal & ~is_subnormal) | (subnormal_bits & is_subnormal);
  const Ints is_nan = magnitude == 0x7f;
  bits = (bits & ~is_nan) | (0x7fc00000 & is_nan);
  bits |= (v & 0x80) << 24;
  copy_bits(bits, w);
}

#if defined(__AVX512F__)
// Sixteen E4M3 codes as f32 values times 2^8: the code's 7 magnitude bits moved up by 7 are an IEEE half
// whose value is the E4M3 value / 2^8, normal and subnormal alike (both formats' subnormals sit 2^-8 apart in
// range), so one conversion widens them; NaN codes (S.1111.111) get the half's all-ones exponent and stay
// NaN. Multiplied by 2^8 times a block's multiplier this is exactly e4m3_to_f32(code) × multiplier: the power
// of two is exact, so the product rounds once, as the scalar decoder's does.
inline void widen_e4m3_over_256(const uint8_t* p, __m512& w) {
  // Sign-extended to 16 bits and moved up by 7: the sign lands on bit 15, exponent and mantissa on bits
  // 13..7; bit 14 (a copy of the sign) is cleared.
  const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<int16_t>(0xbf80)));
  const __m256i nan_bits = _mm256_set1_epi16(0x3f80);
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, nan_bits), nan_bits);
  h = _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7c00)));
  w = _mm512_maskz_cvtph_ps(kAll, h);
}
#endif

#if defined(__AVX512BW__)
// The same for 32 codes at a time (w0: the first 16): one widening of the bytes, the moves into place and the
// NaN codes on 32 halves in one register each, then two conversions. Fewer instructions per code than two
// widen_e4m3_over_256 calls, which is what an FP8 product is bound by. With kNanCodes false the codes must
// hold no NaN code (Tensor::fp8_nan_free): the NaN lanes' three instructions are left out, and every other
// code widens to the same value.
template <bool kNanCodes>
inline void widen_e4m3_pair_over_256(const uint8_t* p, __m512& w0, __m512& w1) {
  constexpr __mmask32 all32 = 0xFFFFFFFFu;
  const __m512i b =
      _mm512_maskz_cvtepi8_epi16(all32, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  __m512i h = _mm512_maskz_and_epi32(kAll, _mm512_maskz_slli_epi16(all32, b, 7),
                                     _mm512_set1_epi16(static_cast<int16_t>(0xbf80)));
  if constexpr (kNanCodes) {
    // A NaN code's half is S.01111.1110000000; adding 0x3e80 makes it S.11111.1000000000, the quiet NaN
    // that widens to the scalar decoder's (no carry reaches the sign).
    const __m512i nan_bits = _mm512_set1_epi16(0x3f80);
    const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_maskz_and_epi32(kAll, h, nan_bits), nan_bits);
    h = _mm512_mask_add_epi16(h, nan, h, _mm512_set1_epi16(0x3e80));
  }
  w0 = _mm512_maskz_cvtph_ps(kAll, _mm512_maskz_extracti64x4_epi64(0xFF, h, 0));
  w1 = _mm512_maskz_cvtph_ps(kAll, _mm512_maskz_extracti64x4_epi64(0xFF, h, 1));
}

// Columns [i, i + 32) of an FP8 row, inside one 128-column block, as f32 (w0: the first 16): the widened
// codes times the block's multiplier × 2^8 (scale_256, the widening's power of two folded in: exact), so each
// is e4m3_to_f32(code) × multiplier rounded once, as the scalar decoder's.
template <bool kNanCodes>
inline void widen_fp8_pair(const uint8_t* codes, const Lanes& scale_256, Lanes& w0, Lanes& w1) {
  __m512 v0, v1;
  widen_e4m3_pair_over_256<kNanCodes>(codes, v0, v1);
  copy_bits(v0, w0);
  copy_bits(v1, w1);
  w0 *= scale_256;
  w1 *= scale_256;
}
#endif

// Sixteen E2M1 codes from 8 bytes, low nibble first: a table lookup of the code.
inline void widen_e2m1(const uint8_t* p, Lanes& w) {
#if defined(__AVX512F__)
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                                      -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  __m512i codes = _mm512_maskz_cvtepu8_epi32(kAll, _mm_unpacklo_epi8(bytes, bytes));  // b0 b0 b1 b1 ...
  codes =
      _mm512_maskz_srlv_epi32(kAll, codes, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
  codes = _mm512_maskz_and_epi32(kAll, codes, _mm512_set1_epi32(0x0f));
  const __m512 v = _mm512_maskz_permutexvar_ps(kAll, codes, table);
  copy_bits(v, w);
#elif defined(__AVX2__)
  const __m256 magnitudes = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
  for (int h = 0; h < 2; ++h) {
    int32_t four;
    std::memcpy(&four, p + 4 * h, sizeof four);
    const __m128i bytes = _mm_cvtsi32_si128(four);
    __m256i codes = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, bytes));
    codes = _mm256_and_si256(_mm256_srlv_epi32(codes, shifts), _mm256_set1_epi32(0x0f));
    const __m256 magnitude = _mm256_permutevar8x32_ps(magnitudes, codes);  // reads the low 3 bits
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
    const __m256 half = _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign));
    std::memcpy(reinterpret_cast<char*>(&w) + h * sizeof half, &half, sizeof half);
  }
#else
  for (int64_t l = 0; l < kLanes; ++l)
    w[l] = e2m1_to_f32(l % 2 ? static_cast<uint8_t>(p[l / 2] >> 4) : p[l / 2]);
#endif
}

#if defined(__AVX512F__)
// A whole MXFP4 block: 32 values from 16 bytes, already scaled (the table is multiplied by the block's scale,
// exact since the scale is a power of two, so each value is the same f32 as widen_e2m1's times the scale).
// Half the instructions per value of two widen_e2m1 calls: one load and one widening of the bytes, the low
// and high nibbles interleaved back into element order by two permutes.
inline void widen_e2m1_block(const uint8_t* p, float scale, Lanes& w0, Lanes& w1) {
  const __m512 table =
      _mm512_maskz_mul_ps(kAll,
                          _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                                         -1.5f, -2.0f, -3.0f, -4.0f, -6.0f),
                          _mm512_set1_ps(scale));
  const __m512i bytes =
      _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i lo = _mm512_maskz_and_epi32(kAll, bytes, _mm512_set1_epi32(0x0f));
  const __m512i hi = _mm512_maskz_srli_epi32(kAll, bytes, 4);
  // Element 2j is byte j's low nibble, 2j + 1 its high one (index 16 + j picks hi[j]).
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512 v0 =
      _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_permutex2var_epi32(kAll, lo, first, hi), table);
  const __m512 v1 =
      _mm512_maskz_permutexvar_ps(kAll, _mm512_maskz_permutex2var_epi32(kAll, lo, second, hi), table);
  copy_bits(v0, w0);
  copy_bits(v1, w1);
}
#endif

// An E8M0 scale's value, 2^(code − 127) (code 0 is the subnormal 2^-127) and NaN for 0xFF, from a table.
constexpr std::array<float, 256> kE8m0Values = [] {
  std::array<float, 256> t{};
  t[0] = std::bit_cast<float>(uint32_t{1} << 22);
  for (uint32_t c = 1; c < 255; ++c) t[c] = std::bit_cast<float>(c << 23);
  t[255] = std::bit_cast<float>(uint32_t{0x7fc00000});
  return t;
}();

inline float e8m0_value(uint8_t code) {
  return kE8m0Values[code];
}

// Row r of a product's weights: its values and (MXFP4, FP8) its scales, as the kernels read them.
struct RowPointers {
  const void* values;
  const void* scales;
};

inline RowPointers row_pointers(const WeightView& w, int64_t r) {
  switch (w.format) {
    case WeightFormat::F32:
      return {static_cast<const float*>(w.data) + r * w.ld, nullptr};
    case WeightFormat::BF16:
    case WeightFormat::F16:
      return {static_cast<const uint16_t*>(w.data) + r * w.ld, nullptr};
    case WeightFormat::MXFP4:
      return {static_cast<const uint8_t*>(w.data) + r * w.ld / 2,
              static_cast<const uint8_t*>(w.scales) + r * w.scale_ld};
    case WeightFormat::FP8:
      return {static_cast<const uint8_t*>(w.data) + r * w.ld,
              static_cast<const float*>(w.scales) + (w.block_row0 + r) / kFp8Block * w.scale_ld};
  }
  return {nullptr, nullptr};
}

// Columns [i, i + 16) of a row as f32 (i a multiple of 16; col0: the FP8 block offset of column 0).
template <WeightFormat F>
void widen(const RowPointers& row, int64_t i, int64_t col0, Lanes& w);

template <>
inline void widen<WeightFormat::F32>(const RowPointers& row, int64_t i, int64_t, Lanes& w) {
  std::memcpy(&w, static_cast<const float*>(row.values) + i, sizeof w);
}

template <>
inline void widen<WeightFormat::BF16>(const RowPointers& row, int64_t i, int64_t, Lanes& w) {
  widen_bf16(static_cast<const uint16_t*>(row.values) + i, w);
}

template <>
inline void widen<WeightFormat::F16>(const RowPointers& row, int64_t i, int64_t, Lanes& w) {
  widen_f16(static_cast<const uint16_t*>(row.values) + i, w);
}

template <>
inline void widen<WeightFormat::MXFP4>(const RowPointers& row, int64_t i, int64_t, Lanes& w) {
  widen_e2m1(static_cast<const uint8_t*>(row.values) + i / 2, w);
  w *= e8m0_value(static_cast<const uint8_t*>(row.scales)[i / kMxfp4Block]);
}

template <>
inline void widen<WeightFormat::FP8>(const RowPointers& row, int64_t i, int64_t col0, Lanes& w) {
  const float* scales = static_cast<const float*>(row.scales);
  const int64_t first = (col0 + i) / kFp8Block, last = (col0 + i + kLanes - 1) / kFp8Block;
  widen_e4m3(static_cast<const uint8_t*>(row.values) + i, w);
  // A shard that starts mid-block has lanes that straddle two blocks (last = first + 1): the lanes from the
  // boundary on take the second block's multiplier, picked by bits so that no lane is read one at a time
  // (which would move the row sums out of registers).
  const Ints lane{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const Ints second = lane >= static_cast<int32_t>((first + 1) * kFp8Block - (col0 + i));
  Ints first_bits, last_bits;
  copy_bits(Lanes{} + scales[first], first_bits);
  copy_bits(Lanes{} + scales[last], last_bits);
  const Ints scale_bits = (first_bits & ~second) | (last_bits & second);
  Lanes scale;
  copy_bits(scale_bits, scale);
  w *= scale;
}

// Column j (past the whole lanes) of a row: the same value the lanes hold.
template <WeightFormat F>
inline float element(const RowPointers& row, int64_t j, int64_t col0) {
  if constexpr (F == WeightFormat::F32) return static_cast<const float*>(row.values)[j];
  if constexpr (F == WeightFormat::BF16) return bf16_to_f32(static_cast<const uint16_t*>(row.values)[j]);
  if constexpr (F == WeightFormat::F16) return f16_to_f32(static_cast<const uint16_t*>(row.values)[j]);
  if constexpr (F == WeightFormat::MXFP4) {
    const uint8_t byte = static_cast<const uint8_t*>(row.values)[j / 2];
    return e2m1_to_f32(j % 2 ? static_cast<uint8_t>(byte >> 4) : byte) *
           e8m0_value(static_cast<const uint8_t*>(row.scales)[j / kMxfp4Block]);
  }
  if constexpr (F == WeightFormat::FP8)
    return e4m3_to_f32(static_cast<const uint8_t*>(row.values)[j]) *
           static_cast<const float*>(row.scales)[(col0 + j) / kFp8Block];
  return 0.0f;
}

}  // namespace expar::weight_lanes
