#pragma once
// Payload codecs for token rows moved by dispatch and combine: a [rows, d] f32 block becomes `rows` encoded
// rows of payload_row_bytes(format, d) bytes each, one row per token row, so an encoded row travels through
// put/get or all_to_all_v exactly like an f32 row does (seed 000 §5.7: "an MXFP8 route carries qdata and
// scale rows that follow the same destination indices").
//
// Formats:
//  - f32: the bytes of the f32 row (identity).
//  - bf16: each element rounded to nearest even (core/convert.hpp), 2 bytes per element.
//  - mxfp8 (OCP Microscaling MXFP8, E4M3 elements): the row is cut into blocks of 32 consecutive elements
//    along d; each block stores one E8M0 shared scale X = 2^s and 32 E4M3 elements P_i = e4m3(V_i / X).
//    Row layout: d E4M3 bytes, then d/32 E8M0 scale bytes. Decoding gives V_i = e4m3_value(P_i) * X.
//  - mxfp8-floor: the same layout with the OCP MX v1.0 reference scale rule (see MxScaleRule).
//
// Scale rules (s is the E8M0 exponent, clamped to [-127, 127]; max = largest |V_i| in the block):
//  - Floor (OCP MX v1.0 §6.3): s = floor(log2(max)) - 8, where 8 is the largest exponent of E4M3. Then
//    max / X lies in [256, 512), but E4M3 ends at 448: when the significand of max exceeds 1.75, the largest
//    elements saturate to ±448 X and lose up to 1/8 of their value.
//  - Ceil (the default, what NVIDIA's and torchao's "RCEIL" mode compute): the smallest s with
//    max <= 448 * 2^s. It equals the Floor rule except that s is one higher exactly when Floor would
//    saturate, so no finite element saturates and every element's error stays within 2^-4 of the block
//    max (2^-4 of its own value for elements in the E4M3 normal range).
// Special blocks, for both rules:
//  - all zero (±0 only): scale code 0 (2^-127), elements ±0 (the sign of zero is kept).
//  - any NaN or ±inf element: the block cannot be represented (E4M3 has no infinity), so its scale is the
//    E8M0 NaN code 0xFF and its elements the E4M3 NaN code; the whole block decodes to NaN (OCP MX: a NaN
//    scale makes every element of its block NaN). Nothing non-finite is silently made finite.
//  - values whose max is below 448 * 2^-127 (f32 subnormals included) use s = -127; elements below the
//    E4M3 resolution there round to zero, as the format requires.
//
// d must be a multiple of 32 for the MX formats: a partial last block would need a tail rule that no
// MXFP8 grouped GEMM consumes, so it is an error (payload_row_bytes throws) instead of a silent pad.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace expar {

enum class PayloadFormat : uint8_t { F32, BF16, MXFP8, MXFP8Floor };

inline constexpr int64_t kMxBlockSize = 32;

enum class MxScaleRule : uint8_t { Floor, Ceil };

// "f32", "bf16", "mxfp8", "mxfp8-floor".
std::string_view payload_format_name(PayloadFormat format);
// Inverse of payload_format_name; throws expar::Error naming the accepted names.
PayloadFormat payload_format_from_name(std::string_view name);
// Every format, in the order above.
std::vector<PayloadFormat> payload_formats();

// Bytes of one encoded row of d elements: 4d (f32), 2d (bf16), d + d/32 (MX formats). Throws expar::Error
// for d < 1, and for an MX format when d is not a multiple of 32.
size_t payload_row_bytes(PayloadFormat format, int64_t d);

// src [rows, d] f32 (row-major, contiguous) -> dst rows * payload_row_bytes(format, d) bytes.
void encode_payload_rows(PayloadFormat format, const float* src, int64_t rows, int64_t d, std::byte* dst);
// src rows * payload_row_bytes(format, d) bytes -> dst [rows, d] f32.
void decode_payload_rows(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d, float* dst);
// src rows * payload_row_bytes(format, d) bytes -> dst [rows, d] BF16 (uint16 storage): each element the
// BF16 rounding (nearest, ties to even; core/convert.hpp's f32_to_bf16) of what decode_payload_rows gives,
// the operand of a BF16 product. A BF16 payload is copied as it is (its rounding is itself).
void decode_payload_rows_bf16(PayloadFormat format, const std::byte* src, int64_t rows, int64_t d,
                              uint16_t* dst);

// The E8M0 code of the shared scale of one block (any length >= 1) under `rule`, with the special cases
// above (0 for an all-zero block, 0xFF for a block with NaN or inf).
uint8_t mx_block_scale(std::span<const float> block, MxScaleRule rule);
// Encodes one block: scale code as mx_block_scale, elements[i] = the E4M3 code of block[i] / scale
// (saturating to ±448, which only the Floor rule reaches). elements.size() must equal block.size().
uint8_t mx_encode_block(std::span<const float> block, MxScaleRule rule, std::span<uint8_t> elements);
// Decodes one block: out[i] = e4m3_value(elements[i]) * 2^(scale - 127), NaN everywhere for scale 0xFF.
void mx_decode_block(std::span<const uint8_t> elements, uint8_t scale, std::span<float> out);

}  // namespace expar
