#include "expar/nn/embedding.hpp"

#include <gtest/gtest.h>

#include "common/random_tensor.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;
using testing::expect_gradient;
using testing::project;

Tensor tokens_of(std::vector<int32_t> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

TEST(Embedding, ForwardCopiesTableRows) {
  const int64_t vocab = 6, d = 5;
  Tensor table = randn({vocab, d}, 1);
  Tensor tokens = tokens_of({3, 0, 5, 3});
  Tensor y = embedding_forward(table, tokens, nullptr);
  ASSERT_EQ(y.shape(), (Shape{4, d}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < d; ++j)
      EXPECT_EQ(y.data<float>()[i * d + j], table.data<float>()[tokens.data<int32_t>()[i] * d + j]);
}

TEST(Embedding, BackwardScattersAndAccumulatesRepeatedTokens) {
  const int64_t vocab = 5, d = 3;
  Tensor tokens = tokens_of({1, 4, 1, 1});
  Tensor grad = randn({4, d}, 2);
  EmbeddingSaved saved{tokens};
  Tensor gt = Tensor::empty({vocab, d});
  gt.fill(0.5f);  // accumulates on top of what is there
  embedding_backward(saved, grad, gt);
  const float* g = grad.data<float>();
  for (int64_t j = 0; j < d; ++j) {
    EXPECT_FLOAT_EQ(gt.data<float>()[1 * d + j], 0.5f + g[0 * d + j] + g[2 * d + j] + g[3 * d + j]);
    EXPECT_FLOAT_EQ(gt.data<float>()[4 * d + j], 0.5f + g[1 * d + j]);
    for (int64_t v : {0, 2, 3}) EXPECT_EQ(gt.data<float>()[v * d + j], 0.5f);
  }
}

TEST(Embedding, GradientMatchesFiniteDifferences) {
  const int64_t vocab = 7, d = 4;
  Tensor table = randn({vocab, d}, 1);
  Tensor tokens = tokens_of({2, 6, 2, 0, 1, 3, 4, 5});
  Tensor r = randn({8, d}, 3);
  EmbeddingSaved saved;
  embedding_forward(table, tokens, &saved);
  Tensor gt = Tensor::zeros({vocab, d});
  embedding_backward(saved, r, gt);
  expect_gradient(
      "embedding grad_table", [&] { return project(r, embedding_forward(table, tokens, nullptr)); }, table,
      gt);
}

TEST(Embedding, RejectsTokensOutsideTheVocabulary) {
  Tensor table = randn({4, 2}, 1);
  for (int32_t bad : {-1, 4, 1000}) {
    try {
      embedding_forward(table, tokens_of({0, bad}), nullptr);
      FAIL() << "no error for token " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  Tensor float_tokens = Tensor::zeros({2});
  EXPECT_THROW(embedding_forward(table, float_tokens, nullptr), Error);
}

}  // namespace
}  // namespace expar::nn
