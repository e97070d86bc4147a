#pragma once
// The payload format of each of the four row movements of an MoE layer step (seed 000 §5.4, §5.7, §5.8,
// Table 8): the rows are encoded with moe/payload_codec where they leave, travel in that format, and are
// decoded to f32 where they are consumed. Every sum, product and GEMM stays f32.
//
//   dispatch       dispatch forward: token rows x to the experts. The expert rank keeps the ENCODED rows
//                  (for MXFP8: E4M3 qdata and E8M0 scales) as the saved Wgrad input and decodes them for
//                  the up-projection and again for its weight gradient (seed 000 §5.7's reuse constraint:
//                  both components stay under the dispatch lease until that Wgrad).
//   combine        combine forward: expert outputs back to their sources (encoded where the experts wrote
//                  them, decoded before the weighted merge).
//   combine_grad   combine backward: w·grad_y rows to the expert rows (decoded before the expert backward).
//   dispatch_grad  dispatch backward: expert input gradients back to the sources (decoded before the sum).
//
// Encoding is row-local and deterministic, so block, rowwise and aggregated, which move the same rows, stay
// bit-identical at every precision. Only the EP paths that move rows (block, rowwise) take a non-f32 leg.
#include <cstdint>
#include <string>

#include "expar/core/tensor.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar {

struct PayloadPrecision {
  PayloadFormat dispatch = PayloadFormat::F32;
  PayloadFormat combine = PayloadFormat::F32;
  PayloadFormat combine_grad = PayloadFormat::F32;
  PayloadFormat dispatch_grad = PayloadFormat::F32;

  static PayloadPrecision uniform(PayloadFormat format) { return {format, format, format, format}; }
  bool all_f32() const {
    return dispatch == PayloadFormat::F32 && combine == PayloadFormat::F32 &&
           combine_grad == PayloadFormat::F32 && dispatch_grad == PayloadFormat::F32;
  }
  // The largest encoded row of the four legs (bytes), for buffers that carry more than one leg.
  size_t max_row_bytes(int64_t d) const;
  // Throws expar::Error when a leg's format cannot encode rows of d elements (MX formats need d % 32 == 0),
  // naming the leg's flag.
  void validate(int64_t d) const;
  // "dispatch mxfp8, combine bf16, combine-grad bf16, dispatch-grad bf16" (or "f32" when all are).
  std::string describe() const;
  bool operator==(const PayloadPrecision&) const = default;
};

// A block of `rows` payload rows of d elements in `format`: f32 [rows, d] for f32, otherwise u8
// [rows, payload_row_bytes(format, d)] (one encoded row per token row).
Tensor payload_tensor(PayloadFormat format, int64_t rows, int64_t d,
                      MemCategory category = MemCategory::Activations);
Tensor borrow_payload(void* data, PayloadFormat format, int64_t rows, int64_t d);
// encode_payload_rows / decode_payload_rows with the rows split over the rank's compute threads when there
// are enough of them (rows are independent, so the thread count changes no bit).
void encode_rows(PayloadFormat format, const float* src, int64_t rows, int64_t d, std::byte* dst);
void decode_rows(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d, float* dst);
// Rows [0, rows) of `payload` (as payload_tensor makes it) decoded into f32 [rows, d]; for f32, the payload
// itself (no copy).
Tensor decode_payload(const Tensor& payload, PayloadFormat format, int64_t rows, int64_t d);
// Rows [begin, begin + n) of `payload` (as payload_tensor makes it) as the BF16 rows [n, d] a BF16 product
// reads (decode_payload_rows_bf16's values): a BF16 payload's own rows, without a copy; any other format
// decoded (f32: rounded) into `scratch` ([>= n, d]), which is then returned. On the calling thread.
const uint16_t* payload_rows_bf16(const Tensor& payload, PayloadFormat format, int64_t begin, int64_t n,
                                  int64_t d, uint16_t* scratch);

}  // namespace expar
