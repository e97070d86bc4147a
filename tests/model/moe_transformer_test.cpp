// The MoE transformer on one rank (path "local"): every parameter's gradient against central finite
// differences of the loss, and a few optimizer steps actually lower the loss on real text.
#include "expar/model/moe_transformer.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"

namespace expar {
namespace {

ModelConfig tiny_config() {
  ModelConfig c = ModelConfig::preset("tiny");
  c.moe.router.aux_loss_coef = 0.0;  // evaluate() reports cross-entropy only
  c.moe.router.z_loss_coef = 0.0;
  return c;
}

std::vector<int32_t> random_bytes(uint64_t seed, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<int32_t>(random_u32(seed, 9, static_cast<uint64_t>(i)) % 256);
  return v;
}

TEST(MoeTransformer, EveryParameterGradientMatchesFiniteDifferences) {
  run_ranks(1, [](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(tiny_config(), {}, *group);
    model.init(5);
    const int64_t batch = 2, seq = 8;
    auto tokens = random_bytes(1, static_cast<int>(batch * seq));
    auto targets = random_bytes(2, static_cast<int>(batch * seq));
    model.zero_grads();
    model.forward_backward(tokens, targets, batch, seq, batch * seq);
    int checked = 0;
    for (Parameter& p : model.parameters()) {
      // The element with the largest gradient, where a finite difference is most informative.
      const float* g = p.grad.data<float>();
      int64_t best = 0;
      for (int64_t i = 1; i < p.grad.numel(); ++i)
        if (std::fabs(g[i]) > std::fabs(g[best])) best = i;
      float* w = p.value.data<float>();
      const float saved = w[best];
      const float eps = 1e-2f * std::max(1.0f, std::fabs(saved));
      w[best] = saved + eps;
      const double up = model.evaluate(tokens, targets, batch, seq).loss;
      w[best] = saved - eps;
      const double down = model.evaluate(tokens, targets, batch, seq).loss;
      w[best] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      EXPECT_NEAR(g[best], numeric, 3e-2 * std::fabs(numeric) + 3e-4) << p.name << " element " << best;
      EXPECT_GT(std::fabs(g[best]), 0.0f) << p.name << " has an all-zero gradient";
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(model.parameters().size()));
  });
}

TEST(MoeTransformer, ZeroGradsZeroesEveryGradientAndTheNextStepGivesTheSameOnes) {
  // zero_grads hands the MoE layers' gradients to MoeLayer::zero_grads (whose next backward writes the expert
  // gradients instead of adding them) and zeroes the rest itself: every gradient must be zero after it, and a
  // step after it must give the gradients of a step after the first zero_grads.
  run_ranks(1, [](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(tiny_config(), {}, *group);
    model.init(7);
    const int64_t batch = 2, seq = 8;
    auto tokens = random_bytes(3, static_cast<int>(batch * seq));
    auto targets = random_bytes(4, static_cast<int>(batch * seq));
    auto gradients = [&] {
      std::vector<std::vector<float>> g;
      for (Parameter& p : model.parameters())
        g.emplace_back(p.grad.data<float>(), p.grad.data<float>() + p.grad.numel());
      return g;
    };
    model.zero_grads();
    model.forward_backward(tokens, targets, batch, seq, batch * seq);
    const auto first = gradients();
    model.forward_backward(tokens, targets, batch, seq, batch * seq);  // a second step added on top
    model.zero_grads();
    for (Parameter& p : model.parameters())
      for (int64_t i = 0; i < p.grad.numel(); ++i)
        ASSERT_EQ(p.grad.data<float>()[i], 0.0f) << p.name << " " << i;
    model.forward_backward(tokens, targets, batch, seq, batch * seq);
    const auto again = gradients();
    ASSERT_EQ(again.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(again[i], first[i]) << model.parameters()[i].name;
  });
}

TEST(MoeTransformer, InitialisationDoesNotDependOnTheEpDegree) {
  // Rank 0's expert 0 weights (and dense weights) are the same with M_E = 1 and M_E = 2.
  std::vector<float> alone, sharded, dense_alone, dense_sharded;
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer m(tiny_config(), {}, *group);
    m.init(11);
    for (auto& p : m.parameters()) {
      if (p.name == "layers.1.moe.experts.w2")
        alone.assign(p.value.data<float>(), p.value.data<float>() + p.value.numel() / 2);
      if (p.name == "layers.0.attn.wq")
        dense_alone.assign(p.value.data<float>(), p.value.data<float>() + p.value.numel());
    }
  });
  run_ranks(2, [&](Comm& world) {
    ModelExecution block;
    block.moe.path = "block";
    MoeTransformer m(tiny_config(), block, world);
    m.init(11);
    if (world.rank() != 0) return;
    for (auto& p : m.parameters()) {
      if (p.name == "layers.1.moe.experts.w2")
        sharded.assign(p.value.data<float>(), p.value.data<float>() + p.value.numel());
      if (p.name == "layers.0.attn.wq")
        dense_sharded.assign(p.value.data<float>(), p.value.data<float>() + p.value.numel());
    }
  });
  ASSERT_FALSE(alone.empty());
  EXPECT_EQ(alone, sharded);
  EXPECT_EQ(dense_alone, dense_sharded);
}

TEST(MoeTransformer, GradientStepsLowerTheLossOnText) {
  run_ranks(1, [](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(tiny_config(), {}, *group);
    model.init(3);
    const std::string text =
        "In the beginning God created the heaven and the earth. And the earth was without form, and void.";
    std::vector<int32_t> tokens(text.begin(), text.begin() + 64),
        targets(text.begin() + 1, text.begin() + 65);
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      model.zero_grads();
      double loss = model.forward_backward(tokens, targets, 1, 64, 64).loss;
      for (auto& p : model.parameters()) {  // plain SGD: the optimizer lives in train/
        float* w = p.value.data<float>();
        const float* g = p.grad.data<float>();
        for (int64_t i = 0; i < p.value.numel(); ++i) w[i] -= 0.5f * g[i];
      }
      if (step == 0) first = loss;
      last = loss;
    }
    EXPECT_NEAR(first, std::log(256.0), 0.3);  // starts near uniform over bytes
    EXPECT_LT(last, first - 1.5);              // and memorises the sentence
  });
}

}  // namespace
}  // namespace expar
