#include "expar/core/weight_view.hpp"

#include <array>
#include <cstring>

#include "expar/core/error.hpp"
#include "expar/core/weight_lanes.hpp"

namespace expar {

namespace {

constexpr std::array<std::pair<WeightFormat, std::string_view>, 5> kNames{{
    {WeightFormat::F32, "f32"},
    {WeightFormat::BF16, "bf16"},
    {WeightFormat::F16, "f16"},
    {WeightFormat::MXFP4, "mxfp4"},
    {WeightFormat::FP8, "fp8"},
}};

}  // namespace

std::string_view weight_format_name(WeightFormat format) {
  for (const auto& [f, name] : kNames)
    if (f == format) return name;
  return "?";
}

WeightFormat weight_format_from_name(std::string_view name) {
  for (const auto& [f, n] : kNames)
    if (n == name) return f;
  fail("weight format '{}' is not known: choose one of {}", name, fmt::join(weight_format_names(), ", "));
}

std::vector<std::string> weight_format_names() {
  std::vector<std::string> names;
  for (const auto& entry : kNames) names.emplace_back(entry.second);
  return names;
}

WeightView WeightView::f32(const float* data, int64_t rows, int64_t cols, int64_t ld) {
  return WeightView{WeightFormat::F32, rows, cols, data, ld};
}

WeightView WeightView::bf16(const uint16_t* data, int64_t rows, int64_t cols, int64_t ld) {
  return WeightView{WeightFormat::BF16, rows, cols, data, ld};
}

WeightView WeightView::f16(const uint16_t* data, int64_t rows, int64_t cols, int64_t ld) {
  return WeightView{WeightFormat::F16, rows, cols, data, ld};
}

WeightView WeightView::mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols,
                             int64_t ld, int64_t scale_ld) {
  return WeightView{WeightFormat::MXFP4, rows, cols, blocks, ld, scales, scale_ld};
}

WeightView WeightView::fp8(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t ld,
                           int64_t scale_ld, int64_t block_row0, int64_t block_col0) {
  return WeightView{WeightFormat::FP8, rows, cols, codes, ld, scales, scale_ld, block_row0, block_col0};
}

WeightView WeightView::row_range(int64_t begin, int64_t end) const {
  EXPAR_CHECK(0 <= begin && begin <= end && end <= rows, "rows [{}, {}) of a weight of {} rows", begin, end,
              rows);
  WeightView v = *this;
  v.rows = end - begin;
  switch (format) {
    case WeightFormat::F32:
      v.data = static_cast<const float*>(data) + begin * ld;
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      v.data = static_cast<const uint16_t*>(data) + begin * ld;
      break;
    case WeightFormat::MXFP4:
      v.data = static_cast<const uint8_t*>(data) + begin * ld / 2;
      v.scales = static_cast<const uint8_t*>(scales) + begin * scale_ld;
      break;
    case WeightFormat::FP8: {
      v.data = static_cast<const uint8_t*>(data) + begin * ld;
      // The first row's block, and where the row sits in it.
      const int64_t first = block_row0 + begin;
      v.scales = static_cast<const float*>(scales) + first / kFp8Block * scale_ld;
      v.block_row0 = first % kFp8Block;
      break;
    }
  }
  return v;
}

WeightView WeightView::col_range(int64_t begin, int64_t end) const {
  EXPAR_CHECK(0 <= begin && begin <= end && end <= cols, "columns [{}, {}) of a weight of {} columns", begin,
              end, cols);
  WeightView v = *this;
  v.cols = end - begin;
  switch (format) {
    case WeightFormat::F32:
      v.data = static_cast<const float*>(data) + begin;
      break;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      v.data = static_cast<const uint16_t*>(data) + begin;
      break;
    case WeightFormat::MXFP4:
      EXPAR_CHECK(begin % kMxfp4Block == 0 && (end % kMxfp4Block == 0 || end == cols),
                  "columns [{}, {}) of an mxfp4 weight: a shard must start and end on a block of {} values "
                  "(choose a layout whose shards are multiples of {}, or load the weight as bf16)",
                  begin, end, kMxfp4Block, kMxfp4Block);
      v.data = static_cast<const uint8_t*>(data) + begin / 2;
      v.scales = static_cast<const uint8_t*>(scales) + begin / kMxfp4Block;
      break;
    case WeightFormat::FP8: {
      v.data = static_cast<const uint8_t*>(data) + begin;
      const int64_t first = block_col0 + begin;
      v.scales = static_cast<const float*>(scales) + first / kFp8Block;
      v.block_col0 = first % kFp8Block;
      break;
    }
  }
  return v;
}

bool held_as_stored(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

bool held_as_stored(const Tensor& t) {
  return held_as_stored(t.dtype()) || (t.dtype() == DType::F8E4M3 && t.block_scales() != nullptr);
}

WeightView weight_view(const Tensor& t) {
  EXPAR_CHECK(t.ndim() == 2, "a weight matrix must be 2-d, got shape {}", shape_string(t.shape()));
  const int64_t n = t.dim(0), k = t.dim(1);
  switch (t.dtype()) {
    case DType::F32:
      return WeightView::f32(static_cast<const float*>(t.raw()), n, k, k);
    case DType::BF16:
      return WeightView::bf16(static_cast<const uint16_t*>(t.raw()), n, k, k);
    case DType::F16:
      return WeightView::f16(static_cast<const uint16_t*>(t.raw()), n, k, k);
    case DType::F8E4M3:
      if (const Tensor* s = t.block_scales()) {
        // The view starts at the block holding element (0, 0), at its offset inside it.
        const int64_t r0 = t.block_row0(), c0 = t.block_col0(), ld = s->dim(1);
        WeightView v = WeightView::fp8(static_cast<const uint8_t*>(t.raw()),
                                       s->data<float>() + r0 / kFp8Block * ld + c0 / kFp8Block, n, k, k, ld,
                                       r0 % kFp8Block, c0 % kFp8Block);
        v.fp8_nan_free = t.fp8_nan_free();
        return v;
      }
      fail(
          "an F8E4M3 tensor {} without its block scales is not a weight matrix: load it with its "
          "weight_scale_inv",
          shape_string(t.shape()));
    default:
      fail("a {} tensor {} is not a weight matrix: weights are held as F32, BF16, F16 or block-scaled FP8",
           dtype_name(t.dtype()), shape_string(t.shape()));
  }
}

double WeightView::row_bytes() const {
  const double n = static_cast<double>(cols);
  switch (format) {
    case WeightFormat::F32:
      return 4.0 * n;
    case WeightFormat::BF16:
    case WeightFormat::F16:
      return 2.0 * n;
    case WeightFormat::MXFP4:
      return n / 2.0 + n / kMxfp4Block;
    case WeightFormat::FP8:
      return n + 4.0 * n / (kFp8Block * kFp8Block);
  }
  return 0.0;
}

void WeightView::validate() const {
  EXPAR_CHECK(rows >= 0 && cols >= 0 && ld >= cols && (data != nullptr || rows * cols == 0),
              "{} weight [{}, {}] with row stride {}: the stride must be at least a row and the data present",
              weight_format_name(format), rows, cols, ld);
  if (format == WeightFormat::MXFP4)
    EXPAR_CHECK(
        cols % kMxfp4Block == 0 && ld % kMxfp4Block == 0 && scale_ld >= cols / kMxfp4Block &&
            scales != nullptr,
        "mxfp4 weight [{}, {}] with row stride {} and scale stride {}: the columns and the stride must "
        "be multiples of {} (whole blocks) and every block needs its scale",
        rows, cols, ld, scale_ld, kMxfp4Block);
  if (format == WeightFormat::FP8)
    EXPAR_CHECK(
        scales != nullptr && 0 <= block_row0 && block_row0 < kFp8Block && 0 <= block_col0 &&
            block_col0 < kFp8Block && scale_ld >= (block_col0 + cols + kFp8Block - 1) / kFp8Block,
        "fp8 weight [{}, {}] with scale stride {} and block offsets ({}, {}): every {}x{} block needs "
        "its scale",
        rows, cols, scale_ld, block_row0, block_col0, kFp8Block, kFp8Block);
}

namespace {

// kNanCodes false (FP8 only): w's codes hold no NaN code (WeightView::fp8_nan_free).
template <WeightFormat F, bool kNanCodes = true>
void dequantize_rows_of_format(const WeightView& w, int64_t begin, int64_t end, float* out, int64_t ld_out) {
  using namespace weight_lanes;
  for (int64_t r = begin; r < end; ++r) {
    const RowPointers row = row_pointers(w, r);
    float* o = out + (r - begin) * ld_out;
    int64_t c = 0;
    // The block forms core/matvec reads with (the same values as the lanes below, in fewer instructions):
    // MXFP4 a whole block of 32 at a time, FP8 32 codes at a time through whole 128-column blocks.
#if defined(__AVX512F__)
    if constexpr (F == WeightFormat::MXFP4)
      for (; c < w.cols; c += kMxfp4Block) {
        Lanes w0, w1;
        widen_e2m1_block(static_cast<const uint8_t*>(row.values) + c / 2,
                         e8m0_value(static_cast<const uint8_t*>(row.scales)[c / kMxfp4Block]), w0, w1);
        std::memcpy(o + c, &w0, sizeof w0);
        std::memcpy(o + c + kLanes, &w1, sizeof w1);
      }
#endif
#if defined(__AVX512BW__)
    if constexpr (F == WeightFormat::FP8)
      if (w.block_col0 == 0)
        for (; c + kFp8Block <= w.cols; c += kFp8Block) {
          const Lanes scale = Lanes{} + static_cast<const float*>(row.scales)[c / kFp8Block] * 256.0f;
          for (int64_t b = 0; b < kFp8Block; b += 2 * kLanes) {
            Lanes w0, w1;
            widen_fp8_pair<kNanCodes>(static_cast<const uint8_t*>(row.values) + c + b, scale, w0, w1);
            std::memcpy(o + c + b, &w0, sizeof w0);
            std::memcpy(o + c + b + kLanes, &w1, sizeof w1);
          }
        }
#endif
    for (; c + kLanes <= w.cols; c += kLanes) {
      Lanes values;
      widen<F>(row, c, w.block_col0, values);
      std::memcpy(o + c, &values, sizeof values);
    }
    for (; c < w.cols; ++c) o[c] = element<F>(row, c, w.block_col0);
  }
}

}  // namespace

void dequantize_rows(const WeightView& w, int64_t begin, int64_t end, float* out, int64_t ld_out) {
  w.validate();
  EXPAR_CHECK(0 <= begin && begin <= end && end <= w.rows && ld_out >= w.cols,
              "dequantize rows [{}, {}) of a weight [{}, {}] into rows of {} floats", begin, end, w.rows,
              w.cols, ld_out);
  switch (w.format) {
    case WeightFormat::F32:
      return dequantize_rows_of_format<WeightFormat::F32>(w, begin, end, out, ld_out);
    case WeightFormat::BF16:
      return dequantize_rows_of_format<WeightFormat::BF16>(w, begin, end, out, ld_out);
    case WeightFormat::F16:
      return dequantize_rows_of_format<WeightFormat::F16>(w, begin, end, out, ld_out);
    case WeightFormat::MXFP4:
      return dequantize_rows_of_format<WeightFormat::MXFP4>(w, begin, end, out, ld_out);
    case WeightFormat::FP8:
      if (w.fp8_nan_free)
        return dequantize_rows_of_format<WeightFormat::FP8, false>(w, begin, end, out, ld_out);
      return dequantize_rows_of_format<WeightFormat::FP8>(w, begin, end, out, ld_out);
  }
}

}  // namespace expar
