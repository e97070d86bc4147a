// `expar train --recompute-moe` (ModelExecution::recompute_every_moe): a few steps on two ranks (M_E 2,
// rowwise, two microbatches), with f32 and with BF16 products and payloads, give bit-identical losses,
// gradient norms and validation loss with and without recomputation of the MoE blocks, and the per-rank
// memory accounting reports fewer resident symmetric bytes: the dry run sized the pool for one dispatch lease
// per block (plus the gradient lease) without recomputation, and for the gradient lease alone (plus a second
// scratch slot) with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/train/trainer.hpp"
#include "train/training_runs.hpp"
#include "train/verse_corpus.hpp"

namespace expar {
namespace {

TrainConfig config_of(bool recompute, testing::Products products = testing::Products::F32) {
  TrainConfig c;
  c.model = ModelConfig::preset("tiny");
  c.model.layers = 3;
  c.ep = 2;
  c.execution.moe.path = "rowwise";
  c.steps = 3;
  c.global_batch = 8;
  c.seq_len = 16;
  c.microbatches = 2;
  c.warmup = 1;
  c.lr = 5e-3;
  c.eval_every = 0;
  c.eval_sequences = 4;
  c.execution.recompute_every_moe = recompute;
  return testing::with_products(c, products);
}

struct TrainRun {
  std::vector<StepRecord> steps;
  double val_loss = 0;
  std::vector<int64_t> symmetric_bytes;  // per rank, at the end
};

TrainRun run(const TrainConfig& cfg) {
  TrainRun r;
  r.symmetric_bytes.resize(2);
  std::mutex m;
  LaunchOptions o;
  o.ranks = 2;
  o.timeout_seconds = 120;
  run_ranks(o, [&](Comm& world) {
    TrainSummary s = train(cfg, world, testing::genesis_corpus());
    std::lock_guard lock(m);
    r.symmetric_bytes[static_cast<size_t>(world.rank())] = s.memory.current_of(MemCategory::SymmetricBuffers);
    if (world.rank() == 0) {
      r.steps = s.steps;
      r.val_loss = s.final_val_loss;
    }
  });
  return r;
}

class TrainRecompute : public ::testing::TestWithParam<testing::Products> {};

TEST_P(TrainRecompute, SameCurveBitForBitWithFewerResidentSymmetricBytes) {
  if (const std::string why = testing::bf16_training_skip(GetParam()); !why.empty()) GTEST_SKIP() << why;
  const TrainRun kept = run(config_of(false, GetParam()));
  const TrainRun recomputed = run(config_of(true, GetParam()));
  ASSERT_EQ(kept.steps.size(), 3u);
  ASSERT_EQ(recomputed.steps.size(), kept.steps.size());
  for (size_t i = 0; i < kept.steps.size(); ++i) {
    EXPECT_EQ(recomputed.steps[i].loss, kept.steps[i].loss) << "step " << i;
    EXPECT_EQ(recomputed.steps[i].aux_loss, kept.steps[i].aux_loss) << "step " << i;
    EXPECT_EQ(recomputed.steps[i].grad_norm, kept.steps[i].grad_norm) << "step " << i;
  }
  EXPECT_GT(kept.steps[0].grad_norm, 0.0);
  EXPECT_EQ(recomputed.val_loss, kept.val_loss);
  // Slot size: M_E x tokens per microbatch and rank x min(K, E_L) rows of d values (the model's bound), f32
  // or BF16 payload rows.
  const ModelConfig m = config_of(false).model;
  const int64_t tokens = 8 / 2 / 2 * 16;  // global batch / dense-DP ranks / microbatches x seq_len
  const int64_t row_bytes = GetParam() == testing::Products::Bf16 ? 2 : 4;
  const int64_t slot = 2 * tokens * std::min<int64_t>(m.moe.router.top_k, m.moe.router.num_experts / 2) *
                       m.model_dim * row_bytes;
  for (size_t r = 0; r < 2; ++r) {
    // Kept: 3 dispatch leases + 1 gradient lease + the output scratch; recomputed: 1 gradient lease + the
    // output and dispatch scratch slots.
    EXPECT_EQ(kept.symmetric_bytes[r], 5 * slot) << "rank " << r;
    EXPECT_EQ(recomputed.symmetric_bytes[r], 3 * slot) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Products, TrainRecompute,
                         ::testing::Values(testing::Products::F32, testing::Products::Bf16),
                         testing::products_name);

}  // namespace
}  // namespace expar
