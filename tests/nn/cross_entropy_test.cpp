#include "expar/nn/cross_entropy.hpp"

#include <gtest/gtest.h>

#include "common/random_tensor.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;
using testing::expect_gradient;

Tensor targets_of(std::vector<int32_t> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// -log softmax(z)[t] in double, averaged over the counted rows.
double reference_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  double total = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = targets.data<int32_t>()[i];
    if (t < 0) continue;
    double max = -INFINITY, sum = 0;
    for (int64_t j = 0; j < v; ++j) max = std::max(max, static_cast<double>(logits.data<float>()[i * v + j]));
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits.data<float>()[i * v + j] - max);
    total += std::log(sum) + max - logits.data<float>()[i * v + t];
    ++counted;
  }
  return total / static_cast<double>(counted);
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int64_t n = 3, vocab = 256;
  Tensor logits = Tensor::empty({n, vocab});
  logits.fill(0.25f);
  auto result = cross_entropy(logits, targets_of({0, 17, 255}));
  EXPECT_NEAR(result.loss, std::log(256.0), 1e-6);
  EXPECT_EQ(result.counted, 3);
}

TEST(CrossEntropy, MatchesReferenceAndIsStableForLargeLogits) {
  const int64_t n = 4, vocab = 11;
  Tensor logits = randn({n, vocab}, 1, 3.0f);
  Tensor targets = targets_of({3, 10, 0, 7});
  auto result = cross_entropy(logits, targets);
  EXPECT_NEAR(result.loss, reference_loss(logits, targets), 1e-5);
  // A shift of every logit by 1e4 changes nothing mathematically; a naive exp would overflow.
  Tensor shifted = logits.clone();
  for (float& z : shifted.span<float>()) z += 1e4f;
  auto shifted_result = cross_entropy(shifted, targets);
  EXPECT_TRUE(std::isfinite(shifted_result.loss));
  EXPECT_NEAR(shifted_result.loss, result.loss, 5e-3);  // the shift itself rounds the logits by up to 5e-4
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t n = 5, vocab = 7;
  Tensor logits = randn({n, vocab}, 1, 2.0f);
  Tensor targets = targets_of({1, -1, 6, 0, 3});
  auto result = cross_entropy(logits, targets);
  EXPECT_EQ(result.counted, 4);
  expect_gradient(
      "cross_entropy grad_logits", [&] { return cross_entropy(logits, targets).loss; }, logits,
      result.grad_logits);
  // Ignored rows have exactly zero gradient, counted rows' gradients sum to zero (softmax minus one-hot).
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(result.grad_logits.data<float>()[1 * vocab + j], 0.0f);
  for (int64_t i : {0, 2, 3, 4}) {
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += result.grad_logits.data<float>()[i * vocab + j];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(CrossEntropy, NormalizerScalesLossAndGradient) {
  const int64_t n = 3, vocab = 5;
  Tensor logits = randn({n, vocab}, 1);
  Tensor targets = targets_of({1, 2, -1});
  auto mean = cross_entropy(logits, targets);
  auto global = cross_entropy(logits, targets, 8);
  EXPECT_NEAR(global.loss_sum, mean.loss_sum, 1e-12);
  EXPECT_NEAR(global.loss, mean.loss_sum / 8, 1e-9);
  for (int64_t i = 0; i < n * vocab; ++i)
    EXPECT_NEAR(global.grad_logits.data<float>()[i], mean.grad_logits.data<float>()[i] * 2 / 8, 1e-7);
}

TEST(CrossEntropy, AllIgnoredGivesZero) {
  Tensor logits = randn({2, 3}, 1);
  auto result = cross_entropy(logits, targets_of({-1, -1}));
  EXPECT_EQ(result.counted, 0);
  EXPECT_EQ(result.loss, 0.0);
  for (float g : result.grad_logits.span<float>()) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropy, RejectsBadTargets) {
  Tensor logits = randn({2, 3}, 1);
  EXPECT_THROW(cross_entropy(logits, targets_of({0, 3})), Error);
  EXPECT_THROW(cross_entropy(logits, targets_of({0, -2})), Error);
  EXPECT_THROW(cross_entropy(logits, targets_of({0})), Error);
  EXPECT_THROW(cross_entropy(logits, targets_of({0, 1}), 0), Error);
}

}  // namespace
}  // namespace expar::nn
