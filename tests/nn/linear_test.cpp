#include "expar/nn/linear.hpp"

#include <gtest/gtest.h>

#include "common/random_tensor.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;
using testing::expect_gradient;
using testing::project;

TEST(Linear, ForwardMatchesNaiveReference) {
  const int64_t n = 5, in = 7, out = 3;
  Tensor x = randn({n, in}, 1), w = randn({out, in}, 2), b = randn({out}, 3);
  Tensor y = linear_forward(x, w, &b, nullptr);
  ASSERT_EQ(y.shape(), (Shape{n, out}));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double ref = b.data<float>()[o];
      for (int64_t k = 0; k < in; ++k)
        ref += static_cast<double>(x.data<float>()[i * in + k]) * w.data<float>()[o * in + k];
      EXPECT_NEAR(y.data<float>()[i * out + o], ref, 1e-5 * (1 + std::fabs(ref)));
    }
  Tensor y_nobias = linear_forward(x, w, nullptr, nullptr);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o)
      EXPECT_NEAR(y.data<float>()[i * out + o] - y_nobias.data<float>()[i * out + o], b.data<float>()[o],
                  1e-5);
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  const int64_t n = 6, in = 5, out = 4;
  Tensor x = randn({n, in}, 1), w = randn({out, in}, 2), b = randn({out}, 3), r = randn({n, out}, 4);
  LinearSaved saved;
  linear_forward(x, w, &b, &saved);
  Tensor gw = Tensor::zeros({out, in}), gb = Tensor::zeros({out});
  Tensor gx = linear_backward(saved, r, w, gw, &gb);
  auto loss = [&] { return project(r, linear_forward(x, w, &b, nullptr)); };
  expect_gradient("linear grad_x", loss, x, gx);
  expect_gradient("linear grad_w", loss, w, gw);
  expect_gradient("linear grad_b", loss, b, gb);
}

TEST(Linear, BackwardAccumulatesParameterGradients) {
  const int64_t n = 4, in = 3, out = 2;
  Tensor x = randn({n, in}, 1), w = randn({out, in}, 2), b = randn({out}, 3), r = randn({n, out}, 4);
  LinearSaved saved;
  linear_forward(x, w, &b, &saved);
  Tensor gw = Tensor::zeros({out, in}), gb = Tensor::zeros({out});
  linear_backward(saved, r, w, gw, &gb);
  Tensor gw1 = gw.clone(), gb1 = gb.clone();
  linear_backward(saved, r, w, gw, &gb);
  for (int64_t i = 0; i < gw.numel(); ++i) EXPECT_FLOAT_EQ(gw.data<float>()[i], 2 * gw1.data<float>()[i]);
  for (int64_t i = 0; i < gb.numel(); ++i) EXPECT_FLOAT_EQ(gb.data<float>()[i], 2 * gb1.data<float>()[i]);
}

TEST(Linear, ZeroRowsIsANoOp) {
  Tensor x = Tensor::empty({0, 3}), w = randn({2, 3}, 2);
  LinearSaved saved;
  Tensor y = linear_forward(x, w, nullptr, &saved);
  EXPECT_EQ(y.shape(), (Shape{0, 2}));
  Tensor gw = Tensor::zeros({2, 3});
  Tensor gx = linear_backward(saved, Tensor::empty({0, 2}), w, gw, nullptr);
  EXPECT_EQ(gx.shape(), (Shape{0, 3}));
  for (float v : gw.span<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Linear, RejectsMismatchedShapesWithAMessage) {
  Tensor x = randn({2, 3}, 1), w = randn({4, 5}, 2);
  try {
    linear_forward(x, w, nullptr, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
  Tensor w_ok = randn({4, 3}, 2), bad_bias = randn({3}, 3);
  EXPECT_THROW(linear_forward(x, w_ok, &bad_bias, nullptr), Error);
}

}  // namespace
}  // namespace expar::nn
