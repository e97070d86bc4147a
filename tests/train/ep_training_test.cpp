// Training with expert parallelism on the threads backend (small shapes):
//  - the same global batch and seed give the same loss curve with M_E = 1, 2 and 4 (1e-4 relative per step),
//    and block vs rowwise give bit-identical curves; with f32 and with BF16 products (--precision bf16);
//  - the gradients of an EP step equal those of the same step without EP (multi-group reducer);
//  - sharding the expert optimizer state over EP_DP changes nothing (1e-6);
//  - a run stopped at step n and resumed from its checkpoint gives the same losses as an uninterrupted run
//    (f32 and BF16 products: the copies are made again from the loaded weights).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/temp_dir.hpp"
#include "expar/topo/training_layout.hpp"
#include "train/training_runs.hpp"

namespace expar {
namespace {

using testing::small_config;

std::vector<StepRecord> run(int ranks, const TrainConfig& cfg) {
  return testing::run_training(ranks, cfg).steps;
}

// With f32 products and, under `expar train --precision bf16`, with BF16 products (each case on itself).
class EpTrainingProducts : public ::testing::TestWithParam<testing::Products> {
 protected:
  void SetUp() override {
    if (const std::string why = testing::bf16_training_skip(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  TrainConfig config(int ep, const std::string& path, int steps, bool bf16_payloads = true) const {
    return testing::with_products(small_config(ep, path, steps), GetParam(), bf16_payloads);
  }
};

// The payloads stay f32 here also with BF16 products: M_E = 1 (local) moves no rows, so BF16 payloads at
// M_E = 2 and 4 would round rows the reference never rounds, a difference of computation, not of order.
TEST_P(EpTrainingProducts, LossCurveIsTheSameForEveryEpDegree) {
  const int steps = 20;
  auto base = run(4, config(1, "local", steps, false));
  ASSERT_EQ(base.size(), static_cast<size_t>(steps));
  EXPECT_LT(base.back().loss, base.front().loss - 0.5);  // it learns
  for (int ep : {2, 4}) {
    auto curve = run(4, config(ep, "rowwise", steps, false));
    ASSERT_EQ(curve.size(), base.size());
    for (size_t i = 0; i < base.size(); ++i)
      EXPECT_NEAR(curve[i].loss, base[i].loss, 1e-4 * base[i].loss) << "M_E=" << ep << " step " << i;
  }
}

TEST_P(EpTrainingProducts, BlockAndRowwiseCurvesAreBitIdentical) {
  auto block = run(4, config(2, "block", 8));
  auto rowwise = run(4, config(2, "rowwise", 8));
  ASSERT_EQ(block.size(), rowwise.size());
  for (size_t i = 0; i < block.size(); ++i) {
    EXPECT_EQ(block[i].loss, rowwise[i].loss) << "step " << i;
    EXPECT_EQ(block[i].grad_norm, rowwise[i].grad_norm) << "step " << i;
  }
  if (GetParam() == testing::Products::Bf16) {  // the BF16 products are in effect: not the f32 curve
    auto f32 = run(4, small_config(2, "rowwise", 8));
    EXPECT_NE(f32.back().loss, rowwise.back().loss);
    EXPECT_NEAR(f32.back().loss, rowwise.back().loss, 0.02 * f32.back().loss);
  }
}

TEST(EpTraining, ShardedExpertOptimizerStateGivesTheSameSteps) {
  auto plain = run(4, small_config(2, "rowwise", 6));
  TrainConfig sharded = small_config(2, "rowwise", 6);
  sharded.shard_optimizer = true;
  auto curve = run(4, sharded);
  ASSERT_EQ(curve.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(curve[i].loss, plain[i].loss, 1e-6) << "step " << i;
}

TEST(EpTraining, GradientAccumulationOverMicrobatchesGivesTheSameSteps) {
  // The same global batch as 1 or 2 microbatches per rank: gradients accumulate with no reduction until the
  // last microbatch, and the loss is normalised over the rank's tokens of the whole step.
  // The load-balancing loss is a product of batch statistics, so it is not additive over microbatches; it is
  // switched off here to compare exactly what accumulation must preserve.
  TrainConfig base = small_config(2, "rowwise", 5);
  base.model.moe.router.aux_loss_coef = 0.0;
  auto one = run(2, base);
  TrainConfig two = base;
  two.microbatches = 2;
  auto curve = run(2, two);
  ASSERT_EQ(curve.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(curve[i].loss, one[i].loss, 1e-5 * one[i].loss) << "step " << i;
    EXPECT_NEAR(curve[i].grad_norm, one[i].grad_norm, 1e-4 * one[i].grad_norm) << "step " << i;
  }
}

// With top_k = num_experts every token routes to every expert, so the capacity plan does not depend on what
// the router learns and the drop rate is known in advance. Source rule, M = 2 ranks of T tokens each, K = E:
// each source may place B = ceil(cf*T*K/M) rows into each destination, which it requests T*E_L rows of, so
// it keeps M*min(T*E_L, B) of its T*K routes; every destination receives M*B rows, which is also the buffer
// capacity M*ceil(cf*T_max*K/M): utilisation exactly 1.
TEST(EpTraining, CapacityWithDropsReportsTheDropRate) {
  TrainConfig c = small_config(2, "rowwise", 3);
  const double cf = 0.3;
  c.execution.moe.capacity = CapacityPolicy::with(CapacityRule::Source, cf);
  c.model.moe.router.top_k = c.model.moe.router.num_experts;
  const int64_t ranks = 2, k = c.model.moe.router.top_k, e_local = c.model.moe.router.num_experts / ranks;
  const int64_t t = c.global_batch / ranks * c.seq_len;  // tokens per rank (dense DP = the 2 ranks)
  const auto budget = static_cast<int64_t>(std::ceil(cf * static_cast<double>(t * k) / ranks));
  ASSERT_LT(budget, t * e_local) << "the case must drop";
  const double kept = static_cast<double>(ranks * std::min(t * e_local, budget)) / static_cast<double>(t * k);
  auto curve = run(2, c);
  ASSERT_EQ(curve.size(), 3u);
  for (const auto& r : curve) {
    EXPECT_NEAR(r.drop_rate, 1.0 - kept, 1e-12);
    EXPECT_EQ(r.utilisation, 1.0);
    EXPECT_TRUE(std::isfinite(r.loss));
  }
}

TEST_P(EpTrainingProducts, ResumeGivesTheSameLossesAsAnUninterruptedRun) {
  const test::TempDir temp("ep_resume");
  const auto dir = temp / "checkpoint";
  auto full = run(4, config(2, "rowwise", 10));
  TrainConfig first = config(2, "rowwise", 10);
  first.stop_after = 5;
  first.checkpoint_dir = dir.string();
  first.shard_optimizer = true;
  auto head = run(4, first);
  ASSERT_EQ(head.size(), 5u);
  // Resume with the same layout but unsharded state, and compare the tail with the uninterrupted run.
  TrainConfig second = config(2, "rowwise", 10);
  second.resume_from = dir.string();
  auto tail = run(4, second);
  ASSERT_EQ(tail.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(head[i].loss, full[i].loss) << "step " << i;
    EXPECT_NEAR(tail[i].loss, full[i + 5].loss, 1e-6 * full[i + 5].loss) << "step " << i + 5;
  }
  // The checkpoint reshards: resuming the same run with M_E = 4 continues the same curve within 1e-4.
  TrainConfig other = config(4, "rowwise", 10);
  other.resume_from = dir.string();
  auto resharded = run(4, other);
  ASSERT_EQ(resharded.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(resharded[i].loss, full[i + 5].loss, 1e-4 * full[i + 5].loss) << "step " << i + 5;
}

INSTANTIATE_TEST_SUITE_P(Products, EpTrainingProducts,
                         ::testing::Values(testing::Products::F32, testing::Products::Bf16),
                         testing::products_name);

}  // namespace
}  // namespace expar
