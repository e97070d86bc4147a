#include "expar/io/safetensors_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {
namespace {

bool is_valid_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::array<std::byte, 8> le64(uint64_t v) {
  std::array<std::byte, 8> out{};
  for (auto& b : out) {
    b = static_cast<std::byte>(v & 0xFF);
    v >>= 8;
  }
  return out;
}

}  // namespace

void SafetensorsWriter::add(std::string name, Tensor tensor) {
  EXPAR_CHECK(!name.empty(), "safetensors writer: a tensor name must not be empty");
  EXPAR_CHECK(
      name != kSafetensorsMetadataKey,
      "safetensors writer: \"{}\" is reserved for the metadata map and cannot name a tensor: rename it",
      kSafetensorsMetadataKey);
  EXPAR_CHECK(is_valid_utf8(name),
              "safetensors writer: tensor name \"{}\" is not valid UTF-8: JSON needs UTF-8",
              text_excerpt(name));
  EXPAR_CHECK(tensor.defined(), "safetensors writer: tensor \"{}\" has no storage: add a tensor with data",
              text_excerpt(name));
  EXPAR_CHECK(!tensors_.contains(name), "safetensors writer: tensor \"{}\" added twice: names must be unique",
              text_excerpt(name));
  tensors_.emplace(std::move(name), std::move(tensor));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  EXPAR_CHECK(is_valid_utf8(key) && is_valid_utf8(value),
              "safetensors writer: metadata \"{}\" is not valid UTF-8: JSON needs UTF-8", text_excerpt(key));
  metadata_[std::move(key)] = std::move(value);
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t total = 0;
  for (const auto& [_, t] : tensors_) total += t.nbytes();
  return total;
}

std::vector<TensorInfo> SafetensorsWriter::layout() const {
  std::vector<TensorInfo> infos;
  for (const auto& [name, t] : tensors_) {
    infos.push_back(TensorInfo{name, t.dtype(), t.shape(), 0, 0});
  }
  std::stable_sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return dtype_size(a.dtype) > dtype_size(b.dtype);
  });
  uint64_t offset = 0;
  for (TensorInfo& info : infos) {
    info.data_begin = offset;
    offset += tensors_.at(info.name).nbytes();
    info.data_end = offset;
  }
  return infos;
}

std::vector<std::byte> SafetensorsWriter::to_bytes() const {
  const auto infos = layout();
  const std::string header = serialize_safetensors_header(infos, metadata_);
  std::vector<std::byte> out;
  out.reserve(8 + header.size() + data_bytes());
  auto length = le64(header.size());
  out.insert(out.end(), length.begin(), length.end());
  const auto* h = reinterpret_cast<const std::byte*>(header.data());
  out.insert(out.end(), h, h + header.size());
  for (const TensorInfo& info : infos) {
    const Tensor& t = tensors_.at(info.name);
    const auto* p = static_cast<const std::byte*>(t.raw());
    if (t.nbytes() > 0) out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  const auto infos = layout();
  const std::string header = serialize_safetensors_header(infos, metadata_);
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    EXPAR_CHECK(out.good(), "{}: cannot create: {}: check that the directory exists and is writable",
                tmp.string(), std::strerror(errno));
    auto length = le64(header.size());
    out.write(reinterpret_cast<const char*>(length.data()), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const TensorInfo& info : infos) {
      const Tensor& t = tensors_.at(info.name);
      if (t.nbytes() > 0)
        out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    }
    out.close();  // a full disk may surface only when the last buffer is written
    if (out.fail()) {
      int err = errno;
      std::filesystem::remove(tmp);
      fail("{}: write failed: {}: check free disk space", path.string(), std::strerror(err));
    }
  }
  try {
    fsync_path(tmp);  // the data is on disk before the name says the file is complete
  } catch (const Error&) {
    std::filesystem::remove(tmp);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail("{}: cannot rename the finished file into place: {}", path.string(), ec.message());
  }
  fsync_path(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  for (const auto& [name, t] : tensors) writer.add(name, t);
  for (const auto& [key, value] : metadata) writer.set_metadata(key, value);
  writer.write(path);
}

}  // namespace expar
