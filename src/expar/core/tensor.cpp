#include "expar/core/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "expar/core/assert.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/host_allocator.hpp"

namespace expar {

std::string shape_string(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    EXPAR_CHECK(d >= 0, "shape {} has a negative dimension: every dimension must be >= 0",
                shape_string(shape));
    n *= d;
  }
  return n;
}

bool poison_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("EXPAR_POISON");
    if (env) return std::string(env) == "1";
#ifndef NDEBUG
    return true;
#else
    return false;
#endif
  }();
  return enabled;
}

void fill_nan(void* data, size_t bytes) {
  // 0xFF bytes are a NaN in f32, bf16, f16 and f64, and the NaN code of e4m3 and e8m0.
  std::memset(data, 0xFF, bytes);
}

void add_into(Tensor& acc, const Tensor& b) {
  EXPAR_ASSERT(acc.dtype() == DType::F32 && b.dtype() == DType::F32 && acc.numel() == b.numel(),
               "add_into: {} {} += {} {}", dtype_name(acc.dtype()), shape_string(acc.shape()),
               dtype_name(b.dtype()), shape_string(b.shape()));
  float* pa = acc.data<float>();
  const float* pb = b.data<float>();
  // The count read once: a store through pa could alias the shape, so numel() in the condition would be
  // recomputed per element and keep the loop from vectorising.
  const int64_t n = acc.numel();
  for (int64_t i = 0; i < n; ++i) pa[i] += pb[i];
}

namespace {
struct Allocation {
  MemoryTracker* tracker;
  MemCategory category;
  int64_t bytes;
};
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype, MemCategory category) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.category_ = category;
  size_t bytes = t.nbytes();
  // host_alloc keeps freed large blocks for reuse: fresh pages are expensive to touch (host_allocator.hpp).
  void* p = host_alloc(bytes);
  MemoryTracker* tracker = &current_tracker();
  tracker->add(category, static_cast<int64_t>(bytes));
  auto info = Allocation{tracker, category, static_cast<int64_t>(bytes)};
  t.storage_ = std::shared_ptr<void>(p, [info](void* q) {
    info.tracker->sub(info.category, info.bytes);
    host_free(q, static_cast<size_t>(info.bytes));
  });
  t.data_ = p;
  if (poison_enabled()) fill_nan(p, bytes);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemCategory category) {
  Tensor t = empty(std::move(shape), dtype, category);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::borrow(void* data, Shape shape, DType dtype) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::borrow_shared(std::shared_ptr<void> owner, void* data, Shape shape, DType dtype) {
  Tensor t = borrow(data, std::move(shape), dtype);
  t.storage_ = std::move(owner);
  return t;
}

Tensor Tensor::charged(MemCategory category) const {
  Tensor t = *this;
  MemoryTracker* tracker = &current_tracker();
  const auto bytes = static_cast<int64_t>(nbytes());
  tracker->add(category, bytes);
  // The deleter keeps the original storage (the file) alive and credits the bytes back.
  t.storage_ = std::shared_ptr<void>(
      data_, [keep = storage_, tracker, category, bytes](void*) { tracker->sub(category, bytes); });
  t.category_ = category;
  return t;
}

int64_t Tensor::dim(int i) const {
  EXPAR_ASSERT(i >= 0 && i < ndim(), "dimension {} requested of a tensor of shape {}", i,
               shape_string(shape_));
  return shape_[static_cast<size_t>(i)];
}

MemCategory Tensor::category() const {
  return category_;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  EXPAR_ASSERT(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
               "rows [{}, {}) out of range for shape {}", begin, end, shape_string(shape_));
  Tensor t = *this;
  int64_t row_elems = shape_[0] == 0 ? 0 : numel() / shape_[0];
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype_);
  if (block_scales_) t.block_row0_ += begin * (row_elems / shape_.back());
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  EXPAR_ASSERT(shape_numel(shape) == numel(), "cannot reshape {} into {}: element counts differ",
               shape_string(shape_), shape_string(shape));
  EXPAR_ASSERT(!block_scales_ || (!shape.empty() && shape.back() == shape_.back()),
               "a block-scaled tensor {} keeps its last dimension: cannot reshape it into {}",
               shape_string(shape_), shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone(MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  if (block_scales_) {
    t.block_scales_ = std::make_shared<const Tensor>(block_scales_->clone(category));
    t.block_row0_ = block_row0_;
    t.block_col0_ = block_col0_;
    t.fp8_nan_free_ = fp8_nan_free_;
  }
  return t;
}

Tensor Tensor::with_block_scales(Tensor scales, int64_t row0, int64_t col0,
                                 std::optional<bool> codes_nan_free) const {
  EXPAR_CHECK(dtype_ == DType::F8E4M3 && ndim() >= 1 && scales.dtype() == DType::F32 && scales.ndim() == 2,
              "block scales go with an F8E4M3 tensor as an F32 grid [rows/128, cols/128] (blocks of 128): "
              "got {} {} with {} {}",
              dtype_name(dtype_), shape_string(shape_), dtype_name(scales.dtype()),
              shape_string(scales.shape()));
  const int64_t cols = shape_.back(), rows = cols == 0 ? 0 : numel() / cols;
  EXPAR_CHECK(
      row0 >= 0 && col0 >= 0 && (rows == 0 || (rows - 1 + row0) / kFp8Block < scales.dim(0)) &&
          (cols == 0 || (cols - 1 + col0) / kFp8Block < scales.dim(1)),
      "an FP8 matrix of {} rows and {} columns from ({}, {}) needs a scale grid of at least [{}, {}], "
      "got {}",
      rows, cols, row0, col0, (rows + row0 + kFp8Block - 1) / kFp8Block,
      (cols + col0 + kFp8Block - 1) / kFp8Block, shape_string(scales.shape()));
  Tensor t = *this;
  t.block_scales_ = std::make_shared<const Tensor>(std::move(scales));
  t.block_row0_ = row0;
  t.block_col0_ = col0;
  t.fp8_nan_free_ =
      codes_nan_free ? *codes_nan_free : !has_e4m3_nan(static_cast<const uint8_t*>(data_), numel());
  return t;
}

void Tensor::fill(float value) {
  float* p = data<float>();
  std::fill(p, p + numel(), value);
}

void Tensor::zero() {
  if (nbytes()) std::memset(data_, 0, nbytes());
}

void Tensor::check_type(DType wanted) const {
  EXPAR_ASSERT(wanted == dtype_, "tensor of shape {} holds {} but was read as {}", shape_string(shape_),
               dtype_name(dtype_), dtype_name(wanted));
}

}  // namespace expar
