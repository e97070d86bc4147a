#pragma once
// SafetensorsWriter: collects named tensors and metadata and writes one valid safetensors file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/io/safetensors_format.hpp"

namespace expar {

class SafetensorsWriter {
 public:
  // Adds a tensor. The writer keeps a Tensor handle (owning tensors share their storage, so this is cheap);
  // the bytes are read when the file is written, so a borrowed view must stay alive until then.
  // Names must be unique, non-empty, valid UTF-8 and not "__metadata__".
  void add(std::string name, Tensor tensor);
  void set_metadata(std::string key, std::string value);

  size_t size() const { return tensors_.size(); }
  // Total bytes of tensor data (the file is 8 + header + this).
  uint64_t data_bytes() const;

  // The layout the file will have: names sorted within descending element size (the reference
  // implementation's order), so every tensor starts at a multiple of its element size after the 8-byte
  // aligned header, and views of the written file never need a copy.
  std::vector<TensorInfo> layout() const;

  // The whole file in memory.
  std::vector<std::byte> to_bytes() const;
  // Writes `path` through a temporary file in the same directory, checks every write, syncs it to disk and
  // renames it into place (then syncs the directory), so a reader never sees a half-written file and a full
  // disk is an error naming the file.
  void write(const std::filesystem::path& path) const;

 private:
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One call: writes `tensors` and `metadata` to `path`.
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace expar
