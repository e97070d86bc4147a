#include "expar/nn/rope.hpp"

#include <gtest/gtest.h>

#include "common/close.hpp"
#include "common/random_tensor.hpp"
#include "nn/rope_reference.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;
using testing::expect_gradient;
using testing::project;

Tensor positions_of(std::vector<int32_t> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

TEST(Rope, MatchesRotateHalfReference) {
  const int64_t hd = 8, heads = 2, half = hd / 2;
  const double theta = 500.0;
  Rope rope(hd, 64, theta);
  Tensor pos = positions_of({0, 1, 7, 63});
  Tensor x = randn({4, heads * hd}, 1);
  Tensor y = x.clone();
  rope.forward(y, heads, pos);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos.data<int32_t>()[r] * std::pow(theta, -2.0 * i / hd);
        const float* v = x.data<float>() + r * heads * hd + h * hd;
        const float* w = y.data<float>() + r * heads * hd + h * hd;
        EXPECT_NEAR(w[i], v[i] * std::cos(angle) - v[i + half] * std::sin(angle), 1e-5);
        EXPECT_NEAR(w[i + half], v[i + half] * std::cos(angle) + v[i] * std::sin(angle), 1e-5);
      }
  // Position 0 is the identity.
  for (int64_t j = 0; j < heads * hd; ++j) EXPECT_EQ(y.data<float>()[j], x.data<float>()[j]);
}

// DeepSeek's pairing: (2i, 2i + 1) rotated by pos·inv_freq[i], here with YaRN's frequencies and scale so
// both parts of the pair formula (angle and s) are exercised.
TEST(Rope, InterleavedPairingMatchesItsFormula) {
  const int64_t hd = 8, heads = 3, half = hd / 2;
  RopeScaling scaling;
  scaling.type = RopeType::Yarn;
  scaling.theta = 500.0;
  scaling.factor = 4.0;
  scaling.original_max_position_embeddings = 16;
  const testing::ReferenceRope ref{scaling};
  Rope rope(hd, 64, scaling, RopePairing::Interleaved);
  EXPECT_EQ(rope.pairing(), RopePairing::Interleaved);
  EXPECT_EQ(Rope(hd, 64).pairing(), RopePairing::Half);
  Tensor pos = positions_of({0, 1, 7, 63});
  Tensor x = randn({4, heads * hd}, 1);
  Tensor y = x.clone();
  rope.forward(y, heads, pos);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos.data<int32_t>()[r] * ref.frequency(i, hd), s = ref.scale();
        const float* v = x.data<float>() + r * heads * hd + h * hd;
        const float* w = y.data<float>() + r * heads * hd + h * hd;
        EXPECT_NEAR(w[2 * i], s * (v[2 * i] * std::cos(angle) - v[2 * i + 1] * std::sin(angle)), 1e-5);
        EXPECT_NEAR(w[2 * i + 1], s * (v[2 * i + 1] * std::cos(angle) + v[2 * i] * std::sin(angle)), 1e-5);
      }
  // Backward is the adjoint: the gradient of Σ r·forward(x).
  Tensor r = randn({4, heads * hd}, 2);
  Tensor grad = r.clone();
  rope.backward(grad, heads, pos);
  expect_gradient(
      "interleaved rope grad_x",
      [&] {
        Tensor z = x.clone();
        rope.forward(z, heads, pos);
        return project(r, z);
      },
      x, grad);
  // Strided rows: the gap after the heads is left alone.
  const int64_t ld = heads * hd + 3;
  Tensor padded = randn({2, ld}, 3), before = padded.clone();
  const int32_t p2[2] = {5, 9};
  rope.apply(padded.data<float>(), 2, heads, ld, p2, false);
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t j = heads * hd; j < ld; ++j)
      EXPECT_EQ(padded.data<float>()[row * ld + j], before.data<float>()[row * ld + j]);
}

TEST(Rope, PreservesNormsAndBackwardUndoesForward) {
  const int64_t hd = 16, heads = 3;
  Rope rope(hd, 300);
  Tensor pos = positions_of({5, 299, 42});
  Tensor x = randn({3, heads * hd}, 1);
  Tensor y = x.clone();
  rope.forward(y, heads, pos);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      double nx = 0, ny = 0;
      for (int64_t i = 0; i < hd; ++i) {
        nx += std::pow(static_cast<double>(x.data<float>()[(r * heads + h) * hd + i]), 2);
        ny += std::pow(static_cast<double>(y.data<float>()[(r * heads + h) * hd + i]), 2);
      }
      EXPECT_NEAR(ny, nx, 1e-5 * nx);
    }
  EXPECT_GT(test::max_abs_diff(x, y), 1e-2);  // it did rotate
  rope.backward(y, heads, pos);
  EXPECT_LT(test::max_abs_diff(x, y), 1e-5);
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int64_t hd = 8;
  Rope rope(hd, 128);
  Tensor q = randn({1, hd}, 1), k = randn({1, hd}, 2);
  auto rotated_dot = [&](int32_t pq, int32_t pk) {
    Tensor a = q.clone(), b = k.clone();
    rope.forward(a, 1, positions_of({pq}));
    rope.forward(b, 1, positions_of({pk}));
    return project(a, b);
  };
  const double base = rotated_dot(10, 3);
  EXPECT_NEAR(rotated_dot(17, 10), base, 1e-4);
  EXPECT_NEAR(rotated_dot(107, 100), base, 1e-4);
  EXPECT_GT(std::fabs(rotated_dot(10, 4) - base), 1e-3);
}

TEST(Rope, BackwardIsTheGradientOfForward) {
  const int64_t hd = 6, heads = 2;
  Rope rope(hd, 32);
  Tensor pos = positions_of({3, 31, 0, 9});
  Tensor x = randn({4, heads * hd}, 1), r = randn({4, heads * hd}, 2);
  Tensor grad = r.clone();
  rope.backward(grad, heads, pos);
  expect_gradient(
      "rope grad_x",
      [&] {
        Tensor y = x.clone();
        rope.forward(y, heads, pos);
        return project(r, y);
      },
      x, grad);
}

TEST(Rope, StridedRowsLeaveTheGapUntouched) {
  const int64_t hd = 4, heads = 1, ld = 6;
  Rope rope(hd, 8);
  Tensor x = randn({2, ld}, 1);
  Tensor y = x.clone();
  const int32_t pos[2] = {3, 5};
  rope.apply(y.data<float>(), 2, heads, ld, pos, false);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = hd; j < ld; ++j) EXPECT_EQ(y.data<float>()[r * ld + j], x.data<float>()[r * ld + j]);
  EXPECT_NE(y.data<float>()[ld], x.data<float>()[ld]);
}

TEST(Rope, RejectsBadConfigurationAndPositions) {
  EXPECT_THROW(Rope(7, 16), Error);
  EXPECT_THROW(Rope(8, 0), Error);
  EXPECT_THROW(Rope(8, 16, 1.0), Error);
  Rope rope(4, 16);
  Tensor x = randn({1, 4}, 1);
  EXPECT_THROW(rope.forward(x, 1, positions_of({16})), Error);
  EXPECT_THROW(rope.forward(x, 1, positions_of({-1})), Error);
  EXPECT_THROW(rope.forward(x, 2, positions_of({0})), Error);
}

RopeScaling scaling_of(RopeType type, double factor, bool truncate = true, double attention_factor = 0) {
  RopeScaling s;
  s.type = type;
  s.theta = 10000.0;
  s.factor = factor;
  s.original_max_position_embeddings = 64;
  s.truncate = truncate;
  s.attention_factor = attention_factor;
  return s;
}

TEST(Rope, ScaledTypesMatchTheirDoublePrecisionFormulas) {
  const int64_t hd = 16, heads = 2, half = hd / 2;
  const std::vector<RopeScaling> cases{
      scaling_of(RopeType::Default, 1.0),         scaling_of(RopeType::Linear, 4.0),
      scaling_of(RopeType::Yarn, 32.0),           scaling_of(RopeType::Yarn, 32.0, false),
      scaling_of(RopeType::Yarn, 8.0, true, 1.3), scaling_of(RopeType::Llama3, 8.0)};
  Tensor pos = positions_of({0, 1, 9, 63, 255});
  Tensor x = randn({5, heads * hd}, 3);
  std::vector<Tensor> outputs;
  for (const RopeScaling& sc : cases) {
    SCOPED_TRACE(rope_type_name(sc.type) + " factor " + std::to_string(sc.factor));
    const testing::ReferenceRope ref{sc};
    Rope rope(hd, 256, sc);
    Tensor y = x.clone();
    rope.forward(y, heads, pos);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = pos.data<int32_t>()[r] * ref.frequency(i, hd), sc2 = ref.scale();
          const float* v = x.data<float>() + r * heads * hd + h * hd;
          const float* w = y.data<float>() + r * heads * hd + h * hd;
          EXPECT_NEAR(w[i], sc2 * (v[i] * std::cos(angle) - v[i + half] * std::sin(angle)), 2e-5);
          EXPECT_NEAR(w[i + half], sc2 * (v[i + half] * std::cos(angle) + v[i] * std::sin(angle)), 2e-5);
        }
    outputs.push_back(y);
    // The adjoint keeps holding with the cos/sin scale.
    Tensor r = randn({5, heads * hd}, 4), grad = r.clone();
    rope.backward(grad, heads, pos);
    expect_gradient(
        "scaled rope grad_x",
        [&] {
          Tensor z = x.clone();
          rope.forward(z, heads, pos);
          return project(r, z);
        },
        x, grad);
  }
  // Every type and setting changes the result (so each is really applied).
  for (size_t a = 0; a < outputs.size(); ++a)
    for (size_t b = a + 1; b < outputs.size(); ++b)
      EXPECT_GT(test::max_abs_diff(outputs[a], outputs[b]), 1e-3) << a << " vs " << b;
  // The yarn case has interpolated, ramped and kept pairs (so the ramp is exercised).
  const std::vector<double> inv = cases[2].inverse_frequencies(hd), plain = cases[0].inverse_frequencies(hd);
  EXPECT_DOUBLE_EQ(inv[0], plain[0]);
  EXPECT_NEAR(inv[7], plain[7] / 32.0, 1e-15);
  EXPECT_GT(inv[1], plain[1] / 32.0);
  EXPECT_LT(inv[1], plain[1]);
}

TEST(Rope, RejectsBadScaling) {
  EXPECT_THROW(Rope(8, 16, scaling_of(RopeType::Linear, 0.0)), Error);
  EXPECT_THROW(Rope(8, 16, scaling_of(RopeType::Linear, NAN)), Error);
  RopeScaling y = scaling_of(RopeType::Yarn, 4.0);
  y.original_max_position_embeddings = 0;
  EXPECT_THROW(Rope(8, 16, y), Error);
  y = scaling_of(RopeType::Yarn, 4.0);
  y.beta_fast = 0.5;  // below beta_slow
  EXPECT_THROW(Rope(8, 16, y), Error);
  RopeScaling l = scaling_of(RopeType::Llama3, 8.0);
  l.high_freq_factor = 0.5;
  EXPECT_THROW(Rope(8, 16, l), Error);
}

}  // namespace
}  // namespace expar::nn
