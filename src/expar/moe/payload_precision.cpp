#include "expar/moe/payload_precision.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

size_t PayloadPrecision::max_row_bytes(int64_t d) const {
  return std::max({payload_row_bytes(dispatch, d), payload_row_bytes(combine, d),
                   payload_row_bytes(combine_grad, d), payload_row_bytes(dispatch_grad, d)});
}

void PayloadPrecision::validate(int64_t d) const {
  const std::pair<const char*, PayloadFormat> legs[] = {{"--dispatch-precision", dispatch},
                                                        {"--combine-precision", combine},
                                                        {"--combine-grad-precision", combine_grad},
                                                        {"--dispatch-grad-precision", dispatch_grad}};
  for (const auto& [flag, format] : legs) {
    try {
      payload_row_bytes(format, d);
    } catch (const Error& e) {
      fail("{} {}: {}", flag, payload_format_name(format), e.what());
    }
  }
}

Tensor payload_tensor(PayloadFormat format, int64_t rows, int64_t d, MemCategory category) {
  if (format == PayloadFormat::F32) return Tensor::empty({rows, d}, DType::F32, category);
  return Tensor::empty({rows, static_cast<int64_t>(payload_row_bytes(format, d))}, DType::U8, category);
}

Tensor borrow_payload(void* data, PayloadFormat format, int64_t rows, int64_t d) {
  if (format == PayloadFormat::F32) return Tensor::borrow(data, {rows, d}, DType::F32);
  return Tensor::borrow(data, {rows, static_cast<int64_t>(payload_row_bytes(format, d))}, DType::U8);
}

namespace {

constexpr int64_t kChunkRows = 64;

bool parallel_worth(int64_t rows, int64_t d) {
  return rows * d >= (int64_t{1} << 16) && omp_get_max_threads() > 1;
}

// fn(begin, n) over chunks of kChunkRows rows, on the rank's compute threads when there are enough rows.
template <typename Fn>
void for_each_chunk(int64_t rows, int64_t d, Fn&& fn) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
#pragma omp parallel for schedule(static) if (parallel_worth(rows, d))
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunkRows, std::min(kChunkRows, rows - c * kChunkRows));
}

}  // namespace

void encode_rows(PayloadFormat format, const float* src, int64_t rows, int64_t d, std::byte* dst) {
  const auto rb = static_cast<int64_t>(payload_row_bytes(format, d));
  for_each_chunk(rows, d, [&](int64_t begin, int64_t n) {
    encode_payload_rows(format, src + begin * d, n, d, dst + begin * rb);
  });
}

void decode_rows(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d, float* dst) {
  const auto rb = static_cast<int64_t>(payload_row_bytes(format, d));
  for_each_chunk(rows, d, [&](int64_t begin, int64_t n) {
    decode_payload_rows(format, src + begin * rb, n, d, dst + begin * d);
  });
}

Tensor decode_payload(const Tensor& payload, PayloadFormat format, int64_t rows, int64_t d) {
  const DType want = format == PayloadFormat::F32 ? DType::F32 : DType::U8;
  const int64_t width = format == PayloadFormat::F32 ? d : static_cast<int64_t>(payload_row_bytes(format, d));
  EXPAR_ASSERT(
      payload.dtype() == want && payload.ndim() == 2 && payload.dim(0) >= rows && payload.dim(1) == width,
      "a {} payload of {} rows x d={} must be {} [>= {}, {}], got {} {}", payload_format_name(format), rows,
      d, dtype_name(want), rows, width, dtype_name(payload.dtype()), shape_string(payload.shape()));
  if (format == PayloadFormat::F32) return payload;
  Tensor out = Tensor::empty({rows, d});
  decode_rows(format, static_cast<const std::byte*>(payload.raw()), rows, d, out.data<float>());
  return out;
}

const uint16_t* payload_rows_bf16(const Tensor& payload, PayloadFormat format, int64_t begin, int64_t n,
                                  int64_t d, uint16_t* scratch) {
  const auto rb = static_cast<int64_t>(payload_row_bytes(format, d));
  EXPAR_ASSERT(begin >= 0 && n >= 0 && payload.ndim() == 2 && payload.dim(0) >= begin + n &&
                   static_cast<int64_t>(payload.nbytes()) >= (begin + n) * rb,
               "rows [{}, {}) of a {} payload {} {}: past its end", begin, begin + n,
               payload_format_name(format), dtype_name(payload.dtype()), shape_string(payload.shape()));
  const std::byte* src = static_cast<const std::byte*>(payload.raw()) + begin * rb;
  switch (format) {
    case PayloadFormat::BF16:
      return reinterpret_cast<const uint16_t*>(src);
    case PayloadFormat::F32:
      round_rows_to_bf16(reinterpret_cast<const float*>(src), d, scratch, d, n, d);
      return scratch;
    default:
      decode_payload_rows_bf16(format, src, n, d, scratch);
      return scratch;
  }
}

std::string PayloadPrecision::describe() const {
  if (all_f32()) return "f32";
  return fmt::format("dispatch {}, combine {}, combine-grad {}, dispatch-grad {}",
                     payload_format_name(dispatch), payload_format_name(combine),
                     payload_format_name(combine_grad), payload_format_name(dispatch_grad));
}

}  // namespace expar
