#pragma once
// Tensor: a contiguous, typed, row-major array with a shape. Owning tensors hold a reference-counted
// 64-byte-aligned allocation charged to a memory category of the allocating rank's tracker; views share
// or borrow storage (row ranges of a tensor, reshapes, or foreign memory such as a symmetric buffer).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expar/core/dtype.hpp"
#include "expar/core/error.hpp"
#include "expar/core/memory.hpp"

namespace expar {

using Shape = std::vector<int64_t>;

// The side of a block of block-scaled FP8 (Tensor::with_block_scales; DeepSeek-V3's weight_block_size).
inline constexpr int64_t kFp8Block = 128;
std::string shape_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage. In debug builds and under EXPAR_POISON=1 float storage is filled with NaN
  // so that reading memory nobody wrote shows up in results.
  static Tensor empty(Shape shape, DType dtype = DType::F32, MemCategory category = MemCategory::Activations);
  static Tensor zeros(Shape shape, DType dtype = DType::F32, MemCategory category = MemCategory::Activations);
  // Non-owning view of foreign memory; the caller keeps it alive.
  static Tensor borrow(void* data, Shape shape, DType dtype);
  // A view of memory that `owner` keeps alive (a mapped file): the view holds a reference to it. Uncharged.
  static Tensor borrow_shared(std::shared_ptr<void> owner, void* data, Shape shape, DType dtype);
  // The same view, charging its bytes to `category` of the calling thread's tracker for as long as this
  // view (or a view of it) lives: how weights used in place from a mapped file show in the memory table.
  Tensor charged(MemCategory category) const;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  MemCategory category() const;

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  template <typename T>
  std::span<T> span() {
    return {data<T>(), static_cast<size_t>(numel())};
  }
  template <typename T>
  std::span<const T> span() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }

  // Rows [begin, end) along dimension 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // A deep copy in its own storage (block scales included).
  Tensor clone(MemCategory category = MemCategory::Activations) const;

  // Block-scaled FP8: an F8E4M3 tensor of codes carries the f32 multipliers of its 128 × 128 blocks (as
  // DeepSeek-V3 and Qwen3's FP8 checkpoints store `weight_scale_inv`). Seen as the matrix [numel / C, C] (C
  // its last dimension), element (r, c) stands for e4m3(code) × scales[(r + row0) / 128][(c + col0) / 128];
  // row0 and col0 place the tensor's first element inside the grid when it is a slice of a larger matrix. Row
  // views move row0, reshapes keep the last dimension; core/weight_view.hpp multiplies by these values.
  // `codes_nan_free` says whether the codes hold a NaN code when the caller knows it from where they were
  // copied (all sources NaN-free: true; else false, which only keeps the NaN lanes' handling); unset, the
  // codes are read to find out.
  Tensor with_block_scales(Tensor scales, int64_t row0 = 0, int64_t col0 = 0,
                           std::optional<bool> codes_nan_free = std::nullopt) const;
  const Tensor* block_scales() const { return block_scales_.get(); }
  int64_t block_row0() const { return block_row0_; }
  int64_t block_col0() const { return block_col0_; }
  // Block-scaled FP8: true when no code is a NaN code (S.1111.111). with_block_scales reads every code once
  // to find out, or takes it from a copy's sources; row views, reshapes and clones keep it (the same codes or
  // fewer). The products skip the NaN lanes' handling where it is set (core/matvec.hpp); a tensor
  // written after its scales were attached would have to attach them again.
  bool fp8_nan_free() const { return fp8_nan_free_; }
  void fill(float value);  // f32 tensors only
  void zero();

 private:
  void check_type(DType wanted) const;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  MemCategory category_ = MemCategory::Other;
  std::shared_ptr<const Tensor> block_scales_;
  int64_t block_row0_ = 0, block_col0_ = 0;
  bool fp8_nan_free_ = false;
};

// Whether freshly allocated float tensors are filled with NaN (debug builds, or EXPAR_POISON=1).
bool poison_enabled();
void fill_nan(void* data, size_t bytes);

// acc += b, element by element (both f32 with the same element count).
void add_into(Tensor& acc, const Tensor& b);

}  // namespace expar
