#pragma once
// SafetensorsFile: a validated safetensors file, read zero-copy. open() maps the file read-only and checks
// the whole header against the file (parse_safetensors) before anything is handed out; afterwards every
// accessor stays inside the bytes the header was checked against.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/io/safetensors_format.hpp"

namespace expar {

class SafetensorsFile {
 public:
  // Maps `path` (mmap, read-only, private) and validates it. Mapped pages are file-backed page cache, so they
  // are not charged to any memory category; only read()/read_rows() copies are.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Validates a copy of `bytes` (kept in a 64-byte-aligned buffer of exactly that size, so views are aligned
  // as in a mapped file). `label` names the buffer in error messages.
  static SafetensorsFile from_bytes(std::span<const std::byte> bytes, std::string label = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& label() const { return label_; }
  // Tensor names in ascending order.
  std::vector<std::string> names() const;
  size_t size() const { return header_.tensors.size(); }
  bool contains(std::string_view name) const;
  const TensorInfo& info(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsHeader& header() const { return header_; }

  // The tensor's bytes in the file.
  std::span<const std::byte> bytes(std::string_view name) const;
  // Zero-copy views: they share the file's bytes and keep them alive (the mapping is released when the
  // SafetensorsFile and every view of it are gone; moving the file keeps views valid). Views of a mapped file
  // are read-only memory: writing through them faults. A tensor that is not aligned to its element size in
  // the file (a header length that is not a multiple of 8, or a writer that did not order tensors by
  // alignment) cannot be viewed; read() copies it instead.
  Tensor view(std::string_view name) const;
  // Rows [begin_row, end_row) of the first dimension (an expert range of a stacked expert tensor).
  Tensor view_rows(std::string_view name, int64_t begin_row, int64_t end_row) const;
  // Owning copies charged to `category`; read_rows touches only the bytes of the requested rows, so a rank
  // that loads its experts reads only those pages of the file.
  Tensor read(std::string_view name, MemCategory category = MemCategory::Other) const;
  Tensor read_rows(std::string_view name, int64_t begin_row, int64_t end_row,
                   MemCategory category = MemCategory::Other) const;
  // Drops the resident pages wholly inside rows [begin_row, end_row) from this process (madvise
  // MADV_DONTNEED on the read-only private mapping; a later access reads them from the file again): a
  // loader that copied those rows gives their pages back, so file pages and copies do not both count. A
  // no-op for a file held in memory (from_bytes).
  void release_rows(std::string_view name, int64_t begin_row, int64_t end_row) const;
  bool mapped() const;

 private:
  struct Storage;
  SafetensorsFile(std::unique_ptr<Storage> storage, std::string label);
  std::span<const std::byte> row_bytes(const TensorInfo& info, int64_t begin_row, int64_t end_row) const;
  Tensor view_of(const TensorInfo& info, std::span<const std::byte> bytes, Shape shape) const;

  std::shared_ptr<Storage> storage_;  // shared with every view
  std::string label_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

}  // namespace expar
