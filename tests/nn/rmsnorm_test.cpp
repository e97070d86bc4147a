#include "expar/nn/rmsnorm.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "common/random_tensor.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;
using testing::expect_gradient;
using testing::project;

// The norms reduce rows in blocks of 8 (rmsnorm.cpp): 11 rows are a block and a tail.
TEST(RmsNorm, ForwardMatchesNaiveReference) {
  const int64_t n = 11, d = 9;
  const float eps = 1e-5f;
  Tensor x = randn({n, d}, 1, 3.0f), g = randn({d}, 2);
  RmsNormSaved saved;
  Tensor y = rmsnorm_forward(x, g, eps, &saved);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += std::pow(static_cast<double>(x.data<float>()[i * d + j]), 2);
    const double r = 1.0 / std::sqrt(ss / d + eps);
    EXPECT_NEAR(saved.rstd.data<float>()[i], r, 1e-6 * r);
    for (int64_t j = 0; j < d; ++j) {
      const double ref = x.data<float>()[i * d + j] * r * g.data<float>()[j];
      EXPECT_NEAR(y.data<float>()[i * d + j], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  }
}

TEST(RmsNorm, UnitGainGivesUnitRootMeanSquare) {
  const int64_t n = 3, d = 16;
  Tensor x = randn({n, d}, 1, 50.0f), g = Tensor::empty({d});
  g.fill(1.0f);
  Tensor y = rmsnorm_forward(x, g, 1e-6f, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += std::pow(static_cast<double>(y.data<float>()[i * d + j]), 2);
    EXPECT_NEAR(std::sqrt(ss / d), 1.0, 1e-5);
  }
}

TEST(RmsNorm, GradientsMatchFiniteDifferences) {
  const int64_t n = 13, d = 8;
  const float eps = 1e-5f;
  Tensor x = randn({n, d}, 1), g = randn({d}, 2), r = randn({n, d}, 3);
  RmsNormSaved saved;
  rmsnorm_forward(x, g, eps, &saved);
  Tensor gg = Tensor::zeros({d});
  Tensor gx = rmsnorm_backward(saved, r, g, gg);
  auto loss = [&] { return project(r, rmsnorm_forward(x, g, eps, nullptr)); };
  expect_gradient("rmsnorm grad_x", loss, x, gx);
  expect_gradient("rmsnorm grad_gain", loss, g, gg);
  // Accumulation: a second backward adds the same amount again.
  Tensor gg1 = gg.clone();
  rmsnorm_backward(saved, r, g, gg);
  for (int64_t j = 0; j < d; ++j) EXPECT_FLOAT_EQ(gg.data<float>()[j], 2 * gg1.data<float>()[j]);
}

// A row's results are the bits of that row normalised alone, whichever rows share the call (the reductions
// run 8 rows at a time, rmsnorm.cpp): 19 rows (two blocks and a tail) against 19 calls of one row, forward
// (y, rstd) and backward (grad_x; grad_gain accumulated over the rows in the same order).
TEST(RmsNorm, ARowGivesTheBitsOfItselfAlone) {
  const int64_t n = 19, d = 37;
  const float eps = 1e-5f;
  Tensor x = randn({n, d}, 4, 2.0f), g = randn({d}, 5), r = randn({n, d}, 6);
  RmsNormSaved saved;
  const Tensor y = rmsnorm_forward(x, g, eps, &saved);
  Tensor gg = Tensor::zeros({d});
  const Tensor gx = rmsnorm_backward(saved, r, g, gg);
  Tensor gg_alone = Tensor::zeros({d});
  for (int64_t i = 0; i < n; ++i) {
    const Tensor xi = x.rows(i, i + 1).clone(), ri = r.rows(i, i + 1).clone();
    RmsNormSaved saved_i;
    const Tensor yi = rmsnorm_forward(xi, g, eps, &saved_i);
    const Tensor gxi = rmsnorm_backward(saved_i, ri, g, gg_alone);
    EXPECT_EQ(std::memcmp(yi.raw(), y.data<float>() + i * d, d * sizeof(float)), 0) << "y row " << i;
    EXPECT_EQ(std::memcmp(gxi.raw(), gx.data<float>() + i * d, d * sizeof(float)), 0) << "grad_x row " << i;
    EXPECT_EQ(saved_i.rstd.data<float>()[0], saved.rstd.data<float>()[i]) << "rstd row " << i;
  }
  EXPECT_EQ(std::memcmp(gg.raw(), gg_alone.raw(), d * sizeof(float)), 0) << "grad_gain";
}

TEST(RmsNorm, RejectsBadArguments) {
  Tensor x = randn({2, 4}, 1), g = randn({4}, 2), g_bad = randn({5}, 2);
  EXPECT_THROW(rmsnorm_forward(x, g_bad, 1e-5f, nullptr), Error);
  EXPECT_THROW(rmsnorm_forward(x, g, 0.0f, nullptr), Error);
}

}  // namespace
}  // namespace expar::nn
