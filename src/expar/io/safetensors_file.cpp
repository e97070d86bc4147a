#include "expar/io/safetensors_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {

// The bytes of the file: either a private read-only mapping or an aligned heap copy.
struct SafetensorsFile::Storage {
  std::byte* data = nullptr;
  size_t size = 0;
  bool mapped = false;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (mapped) {
      ::munmap(data, size);
    } else if (data != nullptr) {
      ::operator delete (data, std::align_val_t{64});
    }
  }
  std::span<const std::byte> span() const { return {data, size}; }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Storage> storage, std::string label)
    : storage_(std::move(storage)), label_(std::move(label)) {
  header_ = parse_safetensors(storage_->span(), label_);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPAR_CHECK(fd >= 0, "{}: cannot open: {}: check the path and its permissions", label,
              std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", label, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file: a safetensors checkpoint must be a file", label);
  }
  auto storage = std::make_unique<Storage>();
  storage->size = static_cast<size_t>(st.st_size);
  if (storage->size > 0) {  // mmap of zero bytes fails; parse_safetensors reports the empty file
    void* p = ::mmap(nullptr, storage->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    EXPAR_CHECK(p != MAP_FAILED, "{}: cannot map {} bytes: {}", label, storage->size, std::strerror(err));
    storage->data = static_cast<std::byte*>(p);
    storage->mapped = true;
  } else {
    ::close(fd);
  }
  return SafetensorsFile(std::move(storage), label);
}

SafetensorsFile SafetensorsFile::from_bytes(std::span<const std::byte> bytes, std::string label) {
  auto storage = std::make_unique<Storage>();
  storage->size = bytes.size();
  if (!bytes.empty()) {
    storage->data = static_cast<std::byte*>(::operator new (bytes.size(), std::align_val_t{64}));
    std::memcpy(storage->data, bytes.data(), bytes.size());
  }
  return SafetensorsFile(std::move(storage), std::move(label));
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, _] : index_) names.push_back(name);
  return names;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return index_.find(name) != index_.end();
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  auto it = index_.find(name);
  EXPAR_CHECK(it != index_.end(), "{}: no tensor named \"{}\" (the file holds {} tensors): check the name",
              label_, text_excerpt(name), index_.size());
  return header_.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo& t = info(name);
  return storage_->span().subspan(header_.data_start() + t.data_begin, t.nbytes());
}

std::span<const std::byte> SafetensorsFile::row_bytes(const TensorInfo& t, int64_t begin_row,
                                                      int64_t end_row) const {
  EXPAR_CHECK(!t.shape.empty(), "{}: tensor \"{}\" is a scalar (shape []): it has no rows to select", label_,
              text_excerpt(t.name));
  EXPAR_CHECK(0 <= begin_row && begin_row <= end_row && end_row <= t.shape[0],
              "{}: tensor \"{}\": rows [{}, {}) are outside its first dimension of {} (shape {}): choose "
              "0 <= begin <= end <= {}",
              label_, text_excerpt(t.name), begin_row, end_row, t.shape[0], shape_string(t.shape),
              t.shape[0]);
  // numel and byte counts were checked against overflow when the header was parsed.
  const uint64_t row_size = t.shape[0] == 0 ? 0 : t.nbytes() / static_cast<uint64_t>(t.shape[0]);
  return storage_->span().subspan(
      header_.data_start() + t.data_begin + static_cast<uint64_t>(begin_row) * row_size,
      static_cast<uint64_t>(end_row - begin_row) * row_size);
}

Tensor SafetensorsFile::view_of(const TensorInfo& t, std::span<const std::byte> bytes, Shape shape) const {
  const size_t align = dtype_size(t.dtype);
  const uint64_t file_offset = static_cast<uint64_t>(bytes.data() - storage_->data);
  EXPAR_CHECK(
      reinterpret_cast<uintptr_t>(bytes.data()) % align == 0,
      "{}: tensor \"{}\" ({}) starts at file offset {}, not a multiple of its {}-byte element size, so it "
      "cannot be viewed in place: use read() to copy it, or rewrite the file with expar's writer, which "
      "aligns every tensor",
      label_, text_excerpt(t.name), dtype_name(t.dtype), file_offset, align);
  // Tensor::borrow takes a mutable pointer; mapped pages are PROT_READ so a write faults instead of silently
  // diverging from the file.
  return Tensor::borrow_shared(storage_, const_cast<std::byte*>(bytes.data()), std::move(shape), t.dtype);
}

Tensor SafetensorsFile::view(std::string_view name) const {
  const TensorInfo& t = info(name);
  return view_of(t, bytes(name), t.shape);
}

Tensor SafetensorsFile::view_rows(std::string_view name, int64_t begin_row, int64_t end_row) const {
  const TensorInfo& t = info(name);
  auto span = row_bytes(t, begin_row, end_row);
  Shape shape = t.shape;
  shape[0] = end_row - begin_row;
  return view_of(t, span, std::move(shape));
}

bool SafetensorsFile::mapped() const {
  return storage_->mapped;
}

void SafetensorsFile::release_rows(std::string_view name, int64_t begin_row, int64_t end_row) const {
  const auto span = row_bytes(info(name), begin_row, end_row);
  // Whole pages only: a page shared with a neighbouring tensor stays (it may be a weight used in place).
  if (storage_->mapped) release_file_pages(span.data(), span.size());
}

Tensor SafetensorsFile::read(std::string_view name, MemCategory category) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(t.shape, t.dtype, category);
  auto span = bytes(name);
  if (!span.empty()) std::memcpy(out.raw(), span.data(), span.size());
  return out;
}

Tensor SafetensorsFile::read_rows(std::string_view name, int64_t begin_row, int64_t end_row,
                                  MemCategory category) const {
  const TensorInfo& t = info(name);
  auto span = row_bytes(t, begin_row, end_row);
  Shape shape = t.shape;
  shape[0] = end_row - begin_row;
  Tensor out = Tensor::empty(std::move(shape), t.dtype, category);
  if (!span.empty()) std::memcpy(out.raw(), span.data(), span.size());
  return out;
}

}  // namespace expar
