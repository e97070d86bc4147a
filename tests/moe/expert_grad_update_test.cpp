// How the expert backward puts the weight gradients into place (moe/expert_mlp.hpp, GradientUpdate): written
// into zeros they equal the gradients added to zeros, for the row form, the column form (padded and not),
// experts of several hundred rows, experts without rows, under batch invariance and with gpt-oss's biases;
// and MoeLayer writes them only in the first backward after zero_grads, adding in every later one and after
// any writable access to its gradients.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expert_fixtures.hpp"
#include "solo_comm.hpp"

namespace expar {
namespace {

const bool kPoisonSet = [] { return setenv("EXPAR_POISON", "1", 1) == 0; }();

constexpr int64_t kD = 48, kH = 80;

struct Backward {
  Tensor grad_in;
  ExpertWeights grads;
};

Backward backward_into_zeros(const ExpertWeights& w, const std::vector<int64_t>& offsets,
                             GradientUpdate update) {
  const int64_t rows = offsets.back();
  Tensor x = Tensor::empty({rows, kD}), grad_y = Tensor::empty({rows, kD});
  fill_normal(x, 9, 7, 1.0f);
  fill_normal(grad_y, 9, 8, 1.0f);
  Tensor y = Tensor::empty({rows, kD});
  ExpertMlpState state;
  expert_mlp_forward(x, PayloadFormat::F32, offsets, w, y, &state);
  Backward b{Tensor::empty({rows, kD}), testing::zeros_like(w)};
  expert_mlp_backward(grad_y, state, w, b.grad_in, b.grads, update);
  return b;
}

// Equal as values (an exact zero may differ in sign), and not all zero, so that the comparison means
// something.
void expect_equal_values(const Tensor& written, const Tensor& added, const std::string& what) {
  if (!added.defined()) return;
  ASSERT_EQ(written.shape(), added.shape()) << what;
  int64_t differing = 0, nonzero = 0;
  for (int64_t i = 0; i < added.numel(); ++i) {
    differing += written.data<float>()[i] != added.data<float>()[i];
    nonzero += added.data<float>()[i] != 0.0f;
  }
  EXPECT_EQ(differing, 0) << what << ": written into zeros differs from added to zeros";
  EXPECT_GT(nonzero, 0) << what;
}

TEST(ExpertGradientUpdate, WrittenIntoZerosEqualsAddedToZeros) {
  // A 2-row expert (the row form), an empty one, 20 rows (the column form, unpadded), 70 (padded to 80) and
  // 600 (the weight-gradient products' inner dimension).
  const std::vector<int64_t> rows{2, 0, 20, 70, 600};
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  std::partial_sum(rows.begin(), rows.end(), offsets.begin() + 1);
  for (bool gpt_oss : {false, true})
    for (int64_t min_rows : {int64_t{0}, batch_invariant_rows()}) {
      set_matmul_min_rows(min_rows);
      const std::string what = fmt::format("{}, min rows {}", gpt_oss ? "gpt-oss" : "swiglu", min_rows);
      const ExpertWeights w = testing::random_experts(static_cast<int64_t>(rows.size()), kD, kH, gpt_oss, 9);
      const Backward added = backward_into_zeros(w, offsets, GradientUpdate::Add);
      const Backward written = backward_into_zeros(w, offsets, GradientUpdate::IntoZeros);
      expect_equal_values(written.grad_in, added.grad_in, what + ": input gradient");
      expect_equal_values(written.grads.w1, added.grads.w1, what + ": w1 gradient");
      expect_equal_values(written.grads.w3, added.grads.w3, what + ": w3 gradient");
      expect_equal_values(written.grads.w2, added.grads.w2, what + ": w2 gradient");
      expect_equal_values(written.grads.b1, added.grads.b1, what + ": b1 gradient");
      expect_equal_values(written.grads.b3, added.grads.b3, what + ": b3 gradient");
      expect_equal_values(written.grads.b2, added.grads.b2, what + ": b2 gradient");
      // The empty expert's gradients are left as they were: zero.
      for (const Tensor* g : {&written.grads.w1, &written.grads.w3, &written.grads.w2}) {
        const int64_t per = g->numel() / g->dim(0);
        for (int64_t i = per; i < 2 * per; ++i) ASSERT_EQ(g->data<float>()[i], 0.0f) << what;
      }
    }
  set_matmul_min_rows(0);
}

MoeConfig layer_config() {
  MoeConfig c;
  c.router.num_experts = 4;
  c.router.top_k = 2;
  c.model_dim = 16;
  c.hidden_dim = 24;
  return c;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

struct ExpertGrads {
  std::vector<float> w1, w3, w2;
};

ExpertGrads expert_grads(const MoeLayer& layer) {
  const ExpertWeights& g = layer.grads().experts;
  return {values(g.w1), values(g.w3), values(g.w2)};
}

void step(MoeLayer& layer, const Tensor& x, const Tensor& grad_y) {
  MoeState state;
  layer.forward(x, state);
  layer.backward(grad_y, state);
}

TEST(ExpertGradientUpdate, MoeLayerWritesOnlyInTheFirstBackwardAfterZeroGrads) {
  testing::SoloComm comm;
  MoeLayer layer(layer_config(), {}, comm, "moe");
  layer.init_params(3);
  Tensor x = Tensor::empty({40, 16}), grad_y = Tensor::empty({40, 16});
  fill_normal(x, 3, 1, 1.0f);
  fill_normal(grad_y, 3, 2, 1.0f);

  // A step first, so that the gradients hold values the step after zero_grads must not add to.
  step(layer, x, grad_y);
  layer.zero_grads();
  step(layer, x, grad_y);
  const ExpertGrads once = expert_grads(std::as_const(layer));
  int64_t nonzero = 0;
  for (float v : once.w1) nonzero += v != 0.0f;
  ASSERT_GT(nonzero, 0);

  // A second backward adds: g + g = 2g exactly (40 tokens: each product is one addition into its sum).
  step(layer, x, grad_y);
  const ExpertGrads twice = expert_grads(std::as_const(layer));
  for (size_t i = 0; i < once.w1.size(); ++i) {
    ASSERT_EQ(twice.w1[i], 2.0f * once.w1[i]) << "w1 element " << i << ": the second backward did not add";
    ASSERT_EQ(twice.w3[i], 2.0f * once.w3[i]) << "w3 element " << i;
  }
  for (size_t i = 0; i < once.w2.size(); ++i) ASSERT_EQ(twice.w2[i], 2.0f * once.w2[i]) << "w2 element " << i;

  // Writable access after zero_grads: whatever the caller put there is added to, not overwritten.
  layer.zero_grads();
  layer.grads().experts.w1.data<float>()[0] = 1.0f;
  step(layer, x, grad_y);
  EXPECT_EQ(std::as_const(layer).grads().experts.w1.data<float>()[0], 1.0f + once.w1[0]);
  EXPECT_EQ(values(std::as_const(layer).grads().experts.w2), once.w2);
}

}  // namespace
}  // namespace expar
