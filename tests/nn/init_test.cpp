#include "expar/nn/init.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace expar::nn {
namespace {

TEST(Init, ValuesDependOnNameNotOnCreationOrder) {
  Tensor a1 = Tensor::empty({4, 8}), b1 = Tensor::empty({4, 8});
  init_normal(a1, 7, "layers.0.attn.wq", 0.02f);
  init_normal(b1, 7, "layers.0.attn.wk", 0.02f);
  Tensor b2 = Tensor::empty({4, 8}), a2 = Tensor::empty({4, 8});
  init_normal(b2, 7, "layers.0.attn.wk", 0.02f);
  init_normal(a2, 7, "layers.0.attn.wq", 0.02f);
  int differ = 0;
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(a1.data<float>()[i], a2.data<float>()[i]);
    EXPECT_EQ(b1.data<float>()[i], b2.data<float>()[i]);
    differ += a1.data<float>()[i] != b1.data<float>()[i];
  }
  EXPECT_EQ(differ, 32);
  Tensor other_seed = Tensor::empty({4, 8});
  init_normal(other_seed, 8, "layers.0.attn.wq", 0.02f);
  EXPECT_NE(other_seed.data<float>()[0], a1.data<float>()[0]);
}

TEST(Init, RowShardMatchesTheFullTensor) {
  const int64_t rows = 6, cols = 5;
  Tensor full = Tensor::empty({rows, cols});
  init_normal(full, 3, "w", 1.0f);
  Tensor shard = Tensor::empty({2, cols});
  init_normal(shard, 3, "w", 1.0f, 3 * cols);
  for (int64_t i = 0; i < 2 * cols; ++i) EXPECT_EQ(shard.data<float>()[i], full.data<float>()[3 * cols + i]);
}

TEST(Init, HasTheRequestedSpread) {
  Tensor t = Tensor::empty({20000});
  init_normal(t, 1, "spread", 0.5f);
  double sum = 0, sq = 0;
  for (float v : t.span<float>()) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / 20000, stddev = std::sqrt(sq / 20000 - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);  // 5 standard errors
  EXPECT_NEAR(stddev, 0.5, 0.015);
  Tensor c = Tensor::empty({3});
  init_constant(c, 1.0f);
  for (float v : c.span<float>()) EXPECT_EQ(v, 1.0f);
  EXPECT_THROW(init_normal(t, 1, "", 0.5f), Error);
  EXPECT_THROW(init_normal(t, 1, "x", -1.0f), Error);
}

}  // namespace
}  // namespace expar::nn
