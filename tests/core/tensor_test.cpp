// Tensor basics: shapes and sizes, zero fill, views that share storage (rows, reshape), deep copies (clone),
// borrowed memory, typed access, and the errors for misuse.
#include "expar/core/tensor.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"

namespace expar {
namespace {

TEST(Tensor, ShapeNumelAndBytes) {
  Tensor t = Tensor::zeros({3, 4, 5}, DType::BF16, MemCategory::Gradients);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.dim(0), 3);
  EXPECT_EQ(t.dim(2), 5);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_EQ(t.category(), MemCategory::Gradients);
  EXPECT_EQ(shape_string(t.shape()), "[3, 4, 5]");
  EXPECT_EQ(shape_numel({}), 1);  // a scalar
  EXPECT_EQ(shape_numel({7, 0}), 0);
}

TEST(Tensor, ZerosAreZeroAndFillWrites) {
  Tensor t = Tensor::zeros({2, 3});
  for (float v : t.span<float>()) EXPECT_EQ(v, 0.0f);
  t.fill(2.5f);
  for (float v : t.span<float>()) EXPECT_EQ(v, 2.5f);
  t.zero();
  for (float v : t.span<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Tensor, RowsAndReshapeShareStorage) {
  Tensor t = Tensor::zeros({4, 3});
  for (int64_t i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor middle = t.rows(1, 3);
  EXPECT_EQ(middle.shape(), (Shape{2, 3}));
  EXPECT_EQ(middle.data<float>(), t.data<float>() + 3);
  EXPECT_EQ(middle.data<float>()[0], 3.0f);
  middle.data<float>()[5] = -1.0f;  // element (2, 2) of t
  EXPECT_EQ(t.data<float>()[8], -1.0f);
  EXPECT_EQ(t.rows(4, 4).numel(), 0);
  Tensor flat = t.reshape({12});
  EXPECT_EQ(flat.shape(), (Shape{12}));
  EXPECT_EQ(flat.data<float>(), t.data<float>());
}

TEST(Tensor, CloneIsADeepCopy) {
  Tensor t = Tensor::zeros({2, 2});
  t.fill(1.0f);
  Tensor c = t.clone(MemCategory::CommScratch);
  EXPECT_NE(c.data<float>(), t.data<float>());
  EXPECT_EQ(c.category(), MemCategory::CommScratch);
  EXPECT_EQ(std::memcmp(c.raw(), t.raw(), t.nbytes()), 0);
  t.fill(3.0f);
  EXPECT_EQ(c.data<float>()[3], 1.0f);
}

TEST(Tensor, BorrowViewsCallerMemory) {
  std::vector<int32_t> mine{1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::borrow(mine.data(), {2, 3}, DType::I32);
  EXPECT_EQ(t.data<int32_t>(), mine.data());
  t.data<int32_t>()[4] = 50;
  EXPECT_EQ(mine[4], 50);
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, MisuseIsRefused) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_THROW(t.data<int32_t>(), InternalError);  // read as the wrong dtype
  EXPECT_THROW(t.rows(2, 1), InternalError);
  EXPECT_THROW(t.rows(0, 3), InternalError);
  EXPECT_THROW(t.reshape({5}), InternalError);
  EXPECT_THROW(t.dim(-1), InternalError);
  EXPECT_THROW(Tensor::zeros({2, -1}), Error);  // a negative dimension names the shape
}

}  // namespace
}  // namespace expar
