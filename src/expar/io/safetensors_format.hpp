#pragma once
// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
// N, N bytes of JSON header, then the data buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data buffer) and may hold
// "__metadata__", a string-to-string map. This file holds the validating parser and the header writer;
// SafetensorsFile and SafetensorsWriter build on them.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/dtype.hpp"
#include "expar/core/tensor.hpp"

namespace expar {

// The reference implementation's limit on N; larger headers are rejected before any parsing.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  // Byte range [data_begin, data_end) relative to the start of the data buffer.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
  uint64_t nbytes() const { return data_end - data_begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;        // N
  uint64_t data_bytes = 0;          // length of the data buffer that follows the header
  std::vector<TensorInfo> tensors;  // in data order (ascending data_begin)
  std::map<std::string, std::string> metadata;
  uint64_t data_start() const { return 8 + header_bytes; }
};

// Validates a whole safetensors file held in `file` (header and data buffer) and returns its header.
// Rejects, with an expar::Error naming `label`, the tensor, the value and the rule: a short file; N above
// the limit or past the end; a header that is not one strict JSON object (duplicate keys, invalid UTF-8,
// trailing garbage); unknown or missing fields; unknown dtypes; shapes that are not arrays of non-negative
// integers or whose element or byte count overflows; data_offsets that are not two non-negative integers,
// have begin > end, run past the data buffer, or disagree with dtype x shape; tensors that overlap or leave
// gaps; and bytes after the last tensor. Never reads outside `file`.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label);

// The JSON header for `tensors` (their data_offsets already assigned) and `metadata`, padded with spaces to a
// multiple of 8 bytes as the reference writer does, so that the data buffer starts 8-byte aligned.
std::string serialize_safetensors_header(const std::vector<TensorInfo>& tensors,
                                         const std::map<std::string, std::string>& metadata);

}  // namespace expar
