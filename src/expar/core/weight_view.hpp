#pragma once
// A weight matrix in the format its checkpoint stores it, seen as the right operand of y = x·Wᵀ: W is
// [rows, cols] with rows the output features and cols the input features (a linear layer's weight in every
// Hugging Face family, and the row order of gpt-oss's MXFP4 expert blocks). The inference engine multiplies
// its weights as stored (docs/inference.md, "Weights as stored"): converting a BF16 checkpoint to f32 doubles
// its memory and the bytes decode reads, and dequantising MXFP4 experts multiplies them by eight.
//
// Every format's value is exact in f32: BF16 and F16 widen; an MXFP4 value is an E2M1 code (±{0, ½, 1, 1½,
// 2, 3, 4, 6}) times 2^(s−127) of its block's E8M0 code s; an FP8 value is the f32 product of an E4M3 code's
// value and its 128 × 128 block's f32 multiplier (DeepSeek-V3's weight_scale_inv), rounded once, as
// transformers dequantises it in f32. The products (core/matvec.hpp, core/weight_matmul.hpp) multiply by
// exactly those values, so a product over a stored matrix gives the bits of the same product over its
// dequantised f32 copy (dequantize_rows).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar {

enum class WeightFormat : uint8_t {
  F32,
  BF16,   // the upper half of an f32
  F16,    // IEEE binary16
  MXFP4,  // OCP microscaling: two E2M1 codes a byte (low nibble first), one E8M0 scale per 32 values of a row
  FP8,    // E4M3 codes, one f32 multiplier per kFp8Block × kFp8Block block of the matrix
};

inline constexpr int64_t kMxfp4Block = 32;

// "f32", "bf16", "f16", "mxfp4", "fp8".
std::string_view weight_format_name(WeightFormat format);
// Inverse of weight_format_name; throws expar::Error naming the accepted names.
WeightFormat weight_format_from_name(std::string_view name);
std::vector<std::string> weight_format_names();

struct WeightView {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  // Row r starts at element r·ld of data (MXFP4: ld values, ld/2 bytes; ld a multiple of kMxfp4Block).
  const void* data = nullptr;
  int64_t ld = 0;
  // MXFP4: E8M0 codes (uint8), row r's block g at scales[r·scale_ld + g].
  // FP8: f32 multipliers, element (r, c)'s at scales[((r + block_row0) / 128)·scale_ld + (c + block_col0) /
  // 128]: block_row0 and block_col0 place element (0, 0) inside its block when a shard starts mid-block.
  const void* scales = nullptr;
  int64_t scale_ld = 0;
  int64_t block_row0 = 0, block_col0 = 0;
  // FP8: true when no code is a NaN code (Tensor::fp8_nan_free, checked at load), so the products may widen
  // the codes without the NaN lanes' handling; false (the default) keeps it, right for any codes.
  bool fp8_nan_free = false;

  static WeightView f32(const float* data, int64_t rows, int64_t cols, int64_t ld);
  static WeightView bf16(const uint16_t* data, int64_t rows, int64_t cols, int64_t ld);
  static WeightView f16(const uint16_t* data, int64_t rows, int64_t cols, int64_t ld);
  static WeightView mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                          int64_t ld, int64_t scale_ld);
  static WeightView fp8(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t ld,
                        int64_t scale_ld, int64_t block_row0 = 0, int64_t block_col0 = 0);

  // Rows [begin, end), the same storage.
  WeightView row_range(int64_t begin, int64_t end) const;
  // Columns [begin, end), the same storage (MXFP4: begin and end whole blocks, or end = cols).
  WeightView col_range(int64_t begin, int64_t end) const;
  // Bytes a product reads per row: its values and (MXFP4, FP8) its share of the scales.
  double row_bytes() const;
  // Throws expar::Error unless the fields describe a readable matrix of this format (MXFP4: cols and ld
  // multiples of 32; strides at least a row).
  void validate() const;
};

// Whether a tensor of this dtype is held and multiplied as it is (F32, BF16, F16); other dtypes are widened.
bool held_as_stored(DType dtype);
// The same for a tensor: also F8E4M3 codes that carry their block scales (Tensor::with_block_scales).
bool held_as_stored(const Tensor& t);
// The bytes a weight holds: its elements and, block-scaled FP8, its scale grid.
inline int64_t weight_bytes(const Tensor& t) {
  if (!t.defined()) return 0;
  const Tensor* s = t.block_scales();
  return static_cast<int64_t>(t.nbytes()) + (s != nullptr ? static_cast<int64_t>(s->nbytes()) : 0);
}
// A 2-d tensor's matrix, held in its own dtype (held_as_stored; anything else is refused by name).
WeightView weight_view(const Tensor& t);

// Rows [begin, end) of w as f32, exactly the values the products multiply by: out[(r − begin)·ld_out + c].
void dequantize_rows(const WeightView& w, int64_t begin, int64_t end, float* out, int64_t ld_out);

}  // namespace expar
