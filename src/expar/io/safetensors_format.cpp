#include "expar/io/safetensors_format.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {
namespace {

using json = nlohmann::json;

// Top-level object -> tensor entry -> shape or data_offsets array.
constexpr int kHeaderMaxDepth = 3;

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

std::map<std::string, std::string> parse_metadata(const json& value, std::string_view label) {
  EXPAR_CHECK(value.is_object(),
              "{}: \"{}\" must be an object mapping strings to strings, got {}: fix the writer of this file",
              label, kSafetensorsMetadataKey, json_excerpt(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    EXPAR_CHECK(entry.is_string(),
                "{}: \"{}\" entry \"{}\" must be a string, got {}: safetensors metadata is "
                "string-to-string (encode other values as text)",
                label, kSafetensorsMetadataKey, text_excerpt(key), json_excerpt(entry));
    metadata.emplace(key, entry.get<std::string>());
  }
  return metadata;
}

TensorInfo parse_tensor(const std::string& name, const json& entry, uint64_t data_bytes,
                        std::string_view label) {
  const std::string who = fmt::format("{}: tensor \"{}\"", label, text_excerpt(name));
  EXPAR_CHECK(entry.is_object(),
              "{}: entry must be an object {{\"dtype\", \"shape\", \"data_offsets\"}}, got {}", who,
              json_excerpt(entry));
  for (const auto& [key, _] : entry.items()) {
    EXPAR_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
                "{}: unknown field \"{}\": a tensor entry holds only dtype, shape and data_offsets", who,
                text_excerpt(key));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    EXPAR_CHECK(entry.contains(field),
                "{}: missing field \"{}\": a tensor entry needs dtype, shape and data_offsets", who, field);
  }

  TensorInfo info;
  info.name = name;
  const json& dtype = entry["dtype"];
  EXPAR_CHECK(dtype.is_string(), "{}: dtype must be a string such as \"F32\", got {}", who,
              json_excerpt(dtype));
  try {
    info.dtype = dtype_from_name(dtype.get_ref<const std::string&>());
  } catch (const Error& e) {
    fail("{}: {}", who, e.what());
  }

  const json& shape = entry["shape"];
  EXPAR_CHECK(shape.is_array(), "{}: shape must be an array of non-negative integers, got {}", who,
              json_excerpt(shape));
  // Every prefix product must fit in int64 (as in the reference's checked_mul), so that no later
  // computation on the shape can overflow, even one that multiplies before it meets a zero dimension.
  uint64_t numel = 1;
  constexpr auto kMaxElems = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& dim = shape[i];
    EXPAR_CHECK(
        dim.is_number_unsigned() && dim.get<uint64_t>() <= kMaxElems,
        "{}: shape dimension {} is {}, not a non-negative integer below 2^63: every dimension must be "
        "one",
        who, i, json_excerpt(dim));
    auto d = dim.get<uint64_t>();
    EXPAR_CHECK(!__builtin_mul_overflow(numel, d, &numel) && numel <= kMaxElems,
                "{}: shape {} has more than 2^63-1 elements (the product overflows): the header is corrupt",
                who, json_excerpt(shape));
    info.shape.push_back(static_cast<int64_t>(d));
  }
  uint64_t want_bytes = 0;
  EXPAR_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &want_bytes),
              "{}: shape {} of {} elements takes more than 2^64 bytes: the header is corrupt", who,
              shape_string(info.shape), dtype_name(info.dtype));

  const json& offsets = entry["data_offsets"];
  EXPAR_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                  offsets[1].is_number_unsigned(),
              "{}: data_offsets must be [begin, end], two non-negative integers, got {}", who,
              json_excerpt(offsets));
  info.data_begin = offsets[0].get<uint64_t>();
  info.data_end = offsets[1].get<uint64_t>();
  EXPAR_CHECK(info.data_begin <= info.data_end,
              "{}: data_offsets [{}, {}] have begin > end: begin must not exceed end", who, info.data_begin,
              info.data_end);
  EXPAR_CHECK(
      info.data_end <= data_bytes,
      "{}: data_offsets [{}, {}] end past the data buffer of {} bytes: the file is truncated or its header "
      "is wrong",
      who, info.data_begin, info.data_end, data_bytes);
  EXPAR_CHECK(
      info.nbytes() == want_bytes,
      "{}: data_offsets [{}, {}] hold {} bytes but dtype {} x shape {} needs {} bytes: the header and the "
      "data disagree",
      who, info.data_begin, info.data_end, info.nbytes(), dtype_name(info.dtype), shape_string(info.shape),
      want_bytes);
  return info;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label) {
  SafetensorsHeader header;
  EXPAR_CHECK(
      file.size() >= 8,
      "{}: file is {} bytes, shorter than the 8-byte header length that starts a safetensors file: it is "
      "truncated or not safetensors",
      label, file.size());
  header.header_bytes = read_le64(file.data());
  EXPAR_CHECK(header.header_bytes <= kSafetensorsMaxHeaderBytes,
              "{}: header length {} exceeds the safetensors limit of {} bytes: the file is corrupt or not "
              "safetensors",
              label, header.header_bytes, kSafetensorsMaxHeaderBytes);
  EXPAR_CHECK(header.header_bytes <= file.size() - 8,
              "{}: header length {} runs past the end of the file ({} bytes after the length): the file is "
              "truncated or not safetensors",
              label, header.header_bytes, file.size() - 8);
  header.data_bytes = file.size() - 8 - header.header_bytes;

  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, header.header_bytes);
  EXPAR_CHECK(!text.empty() && text.front() == '{',
              "{}: header does not start with '{{' (first byte {}): a safetensors header is a JSON object",
              label,
              text.empty() ? std::string("none, the header is empty")
                           : fmt::format("0x{:02x}", static_cast<unsigned char>(text.front())));
  const json root = parse_strict_json(text, fmt::format("{}: header", label), kHeaderMaxDepth);
  EXPAR_CHECK(root.is_object(), "{}: header must be a JSON object mapping tensor names to entries", label);

  for (const auto& [key, entry] : root.items()) {
    if (key == kSafetensorsMetadataKey) {
      header.metadata = parse_metadata(entry, label);
    } else {
      header.tensors.push_back(parse_tensor(key, entry, header.data_bytes, label));
    }
  }

  // The tensors must tile the data buffer: sorted by position, each starts where the previous one ended.
  // Zero-byte tensors may sit anywhere on that chain, including several at one offset.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    EXPAR_CHECK(
        t.data_begin >= covered,
        "{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap: tensors must tile the data buffer without "
        "overlap",
        label, text_excerpt(previous->name), previous->data_begin, previous->data_end, text_excerpt(t.name),
        t.data_begin, t.data_end);
    EXPAR_CHECK(
        t.data_begin == covered,
        "{}: gap of {} bytes before tensor \"{}\" at data offset {}: tensors must tile the data buffer "
        "without gaps",
        label, t.data_begin - covered, text_excerpt(t.name), t.data_begin);
    covered = t.data_end;
    previous = &t;
  }
  EXPAR_CHECK(
      covered == header.data_bytes,
      "{}: {} trailing bytes after the last tensor (the data buffer holds {} bytes, the tensors end at {}): "
      "the file has extra bytes or its header is wrong",
      label, header.data_bytes - covered, header.data_bytes, covered);
  return header;
}

std::string serialize_safetensors_header(const std::vector<TensorInfo>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root[std::string(kSafetensorsMetadataKey)] = metadata;
  for (const TensorInfo& t : tensors) {
    root[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                    {"shape", t.shape},
                    {"data_offsets", {t.data_begin, t.data_end}}};
  }
  std::string text = root.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace expar
