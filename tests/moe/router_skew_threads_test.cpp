// The skewed routing load of the benchmarks (moe/router_skew.hpp): the ranks form a permutation, another in
// each MoE layer, the bias is
// −s·ln(rank) (checked through the router against hand-worked softmax weights), top-1 selection over
// Gumbel-distributed logits picks each expert with the Zipf probability the bias promises, every rank
// (thread) computes the same bits, and bad exponents are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/expect_error.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/router.hpp"
#include "expar/moe/router_skew.hpp"

namespace expar {
namespace {

TEST(RouterSkew, RanksArePermutationsDrawnFromTheSeed) {
  const std::vector<int> a = router_skew_ranks(16, 1, 0);
  std::vector<int> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> one_to_e(16);
  std::iota(one_to_e.begin(), one_to_e.end(), 1);
  EXPECT_EQ(sorted, one_to_e);
  EXPECT_NE(a, one_to_e) << "the hottest experts should not simply be the first ones";
  EXPECT_EQ(a, router_skew_ranks(16, 1, 0));
  EXPECT_NE(a, router_skew_ranks(16, 2, 0));
}

// Real models' hot experts differ from layer to layer, so each layer's popularity is its own permutation.
TEST(RouterSkew, EachLayerDrawsItsOwnPermutation) {
  std::vector<int> one_to_e(32);
  std::iota(one_to_e.begin(), one_to_e.end(), 1);
  std::vector<std::vector<int>> layers;
  for (int layer = 0; layer < 4; ++layer) {
    layers.push_back(router_skew_ranks(32, 3, layer));
    std::vector<int> sorted = layers.back();
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, one_to_e) << "layer " << layer;
    EXPECT_EQ(layers.back(), router_skew_ranks(32, 3, layer)) << "layer " << layer;
    for (int before = 0; before < layer; ++before)
      EXPECT_NE(layers.back(), layers[static_cast<size_t>(before)]) << "layers " << before << ", " << layer;
  }
  // The hottest expert moves too (not only the tail of the permutation).
  std::vector<int> hottest;
  for (const std::vector<int>& ranks : layers)
    hottest.push_back(static_cast<int>(std::find(ranks.begin(), ranks.end(), 1) - ranks.begin()));
  std::sort(hottest.begin(), hottest.end());
  EXPECT_GT(std::unique(hottest.begin(), hottest.end()) - hottest.begin(), 1);
  testing::expect_error([] { router_skew_ranks(8, 1, -1); }, {"layer -1", ">= 0"});
  const Tensor bias = router_skew_bias(1.0, 32, 3, 2);
  for (int e = 0; e < 32; ++e)
    EXPECT_FLOAT_EQ(bias.data<float>()[e], static_cast<float>(-std::log(layers[2][static_cast<size_t>(e)])));
}

TEST(RouterSkew, BiasIsMinusSTimesTheLogOfTheRank) {
  const std::vector<int> ranks = router_skew_ranks(6, 7, 0);
  const Tensor bias = router_skew_bias(1.5, 6, 7, 0);
  ASSERT_EQ(bias.numel(), 6);
  for (int e = 0; e < 6; ++e)
    EXPECT_FLOAT_EQ(bias.data<float>()[e],
                    static_cast<float>(-1.5 * std::log(ranks[static_cast<size_t>(e)])));
  const Tensor none = router_skew_bias(0.0, 6, 7, 0);
  for (int e = 0; e < 6; ++e) EXPECT_EQ(none.data<float>()[e], 0.0f);
}

// Zero router weights: every raw logit is 0, so the softmax weights are the bias's alone. E = 4:
// s = 1 gives 1/r over H_4 = 25/12, i.e. 12/25, 6/25, 4/25, 3/25; s = 2 gives 1/r² over 205/144.
TEST(RouterSkew, SoftmaxWeightsUnderTheBiasFollowZipf) {
  for (const auto& [s, total] : {std::pair{1.0, 25.0 / 12.0}, std::pair{2.0, 205.0 / 144.0}}) {
    RouterConfig c{.num_experts = 4, .top_k = 4};
    const Tensor w = Tensor::zeros({4, 3});
    const Tensor x = Tensor::zeros({2, 3});
    Tensor bias;
    add_router_skew(bias, s, 4, 11, 0);
    RouterState state;
    const RouterOutput out = router_forward(c, x, w, nullptr, state, &bias);
    const std::vector<int> ranks = router_skew_ranks(4, 11, 0);
    for (int64_t t = 0; t < 2; ++t)
      for (int k = 0; k < 4; ++k) {
        const int e = out.topk_idx.data<int32_t>()[t * 4 + k];
        const double r = ranks[static_cast<size_t>(e)];
        EXPECT_EQ(r, k + 1) << "selection goes by popularity rank";
        EXPECT_NEAR(out.topk_weight.data<float>()[t * 4 + k], 1.0 / std::pow(r, s) / total, 1e-6);
      }
  }
}

// A router bias adds to what is there (gpt-oss's trained bias) instead of replacing it.
TEST(RouterSkew, AddsToAnExistingLogitBias) {
  Tensor bias = Tensor::empty({5});
  for (int e = 0; e < 5; ++e) bias.data<float>()[e] = 0.25f * static_cast<float>(e);
  const Tensor before = bias;
  add_router_skew(bias, 1.0, 5, 3, 0);
  const Tensor skew = router_skew_bias(1.0, 5, 3, 0);
  for (int e = 0; e < 5; ++e)
    EXPECT_FLOAT_EQ(bias.data<float>()[e], 0.25f * static_cast<float>(e) + skew.data<float>()[e]);
  EXPECT_NE(bias.raw(), before.raw()) << "a loaded bias may be read-only: the sum is a new tensor";
}

// Gumbel-max: with i.i.d. Gumbel logits, top-1 picks expert e with probability softmax(bias)_e, so the
// selection frequencies must be r^-s / Σ r^-s. 40000 tokens, E = 8, s = 1: within 5 standard deviations.
TEST(RouterSkew, TopOneSelectionFrequencyIsZipf) {
  constexpr int kE = 8;
  constexpr int64_t kTokens = 40000;
  RouterConfig c{.num_experts = kE, .top_k = 1};
  Tensor w = Tensor::zeros({kE, kE});
  for (int e = 0; e < kE; ++e) w.data<float>()[e * kE + e] = 1.0f;
  Tensor x = Tensor::empty({kTokens, kE});
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = std::max(1e-12, static_cast<double>(random_uniform(5, 77, static_cast<uint64_t>(i))));
    x.data<float>()[i] = static_cast<float>(-std::log(-std::log(u)));
  }
  const Tensor bias = router_skew_bias(1.0, kE, 5, 0);
  RouterState state;
  const RouterOutput out = router_forward(c, x, w, nullptr, state, &bias);
  const std::vector<int> ranks = router_skew_ranks(kE, 5, 0);
  double harmonic = 0;
  for (int r = 1; r <= kE; ++r) harmonic += 1.0 / r;
  for (int e = 0; e < kE; ++e) {
    const double p = 1.0 / ranks[static_cast<size_t>(e)] / harmonic;
    const double freq = static_cast<double>(out.expert_counts[static_cast<size_t>(e)]) / kTokens;
    EXPECT_NEAR(freq, p, 5.0 * std::sqrt(p * (1 - p) / kTokens)) << "expert " << e;
  }
}

TEST(RouterSkew, EveryRankComputesTheSameBias) {
  LaunchOptions launch;
  launch.ranks = 4;
  run_ranks(launch, [](Comm& world) {
    const Tensor mine = router_skew_bias(1.0, 32, 9, 0);
    Tensor all = Tensor::empty({4 * 32});
    world.all_gather(mine.raw(), all.raw(), 32, DType::F32);
    for (int r = 1; r < 4; ++r)
      EXPECT_EQ(std::memcmp(all.data<float>(), all.data<float>() + r * 32, 32 * sizeof(float)), 0)
          << "rank " << r;
  });
}

TEST(RouterSkew, RefusesExponentsThatAreNegativeOrNotFinite) {
  for (double s : {-0.5, std::nan(""), static_cast<double>(INFINITY)})
    testing::expect_error([&] { router_skew_bias(s, 8, 1, 0); },
                          {"--router-skew", "finite number >= 0", "pass --router-skew 1"});
}

}  // namespace
}  // namespace expar
