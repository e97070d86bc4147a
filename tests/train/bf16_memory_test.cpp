// `expar train --precision bf16` holds one BF16 copy of every weight its products read, and the trainer's
// memory accounting (the start-up table, TrainSummary::memory) counts them: on each rank the dense weights
// grow by 2 bytes per element of attention's projections, the LM head and the shared expert, and the expert
// weights by 2 bytes per element of the local experts, against the same run with f32 products.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "train/training_runs.hpp"

namespace expar {
namespace {

using testing::Products;

std::vector<MemorySnapshot> memory_of(const TrainConfig& cfg, int ranks) {
  std::vector<MemorySnapshot> out(static_cast<size_t>(ranks));
  std::mutex m;
  LaunchOptions o;
  o.ranks = ranks;
  run_ranks(o, [&](Comm& world) {
    TrainSummary s = train(cfg, world, testing::repeated_text_corpus());
    std::lock_guard lock(m);
    out[static_cast<size_t>(world.rank())] = s.memory;
  });
  return out;
}

TEST(Bf16TrainingMemory, TheCopiesAreCountedInTheirWeightsCategories) {
  if (const std::string why = testing::bf16_training_skip(Products::Bf16); !why.empty()) GTEST_SKIP() << why;
  const int ranks = 2, ep = 2;
  const TrainConfig f32 = testing::small_config(ep, "rowwise", 1);
  const TrainConfig bf16 = testing::with_products(f32, Products::Bf16);
  const ModelConfig& m = f32.model;
  ASSERT_GT(m.shared_expert_hidden, 0) << "the case must have a shared expert";
  const int64_t d = m.model_dim, qd = m.heads * m.head_dim, kd = m.kv_heads * m.head_dim;
  const int64_t attention = qd * d + 2 * kd * d + d * qd, head = m.vocab * d,
                shared = 3 * m.shared_expert_hidden * d;
  const int64_t local_experts = m.moe.router.num_experts / ep;
  const int64_t experts = local_experts * 3 * m.moe.hidden_dim * d;
  const auto a = memory_of(f32, ranks), b = memory_of(bf16, ranks);
  for (size_t r = 0; r < static_cast<size_t>(ranks); ++r) {
    EXPECT_EQ(b[r].current_of(MemCategory::DenseWeights) - a[r].current_of(MemCategory::DenseWeights),
              2 * (m.layers * (attention + shared) + head))
        << "rank " << r;
    EXPECT_EQ(b[r].current_of(MemCategory::ExpertWeights) - a[r].current_of(MemCategory::ExpertWeights),
              2 * m.layers * experts)
        << "rank " << r;
  }
}

}  // namespace
}  // namespace expar
