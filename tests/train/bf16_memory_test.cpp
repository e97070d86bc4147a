// `expar train --precision bf16` holds one BF16 copy of every weight its products read, and the trainer's
// memory accounting (the start-up table, TrainSummary::memory) counts them: on each rank the dense weights
// grow by 2 bytes per element of attention's projections, the LM head and the shared expert, and the expert
// weights by 2 bytes per element of the local experts, against the same run with f32 products.
// The activations a forward saves for the backward whose only reader there is a BF16 weight-gradient
// product are saved in BF16 (attention's input rows and context, the LM head's input), and so are the
// experts' pre-activations (the gate and up products' results, BF16 as autocast's products return them; the
// routed experts' and the shared expert's): a training forward holds 2 bytes less per element of each than
// with f32 products, exactly, where f32 keeps the f32 tensors, and everything else it saves alike.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "expar/model/moe_transformer.hpp"
#include "expar/moe/expert_mlp.hpp"
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

std::vector<int32_t> some_tokens(int n, int shift) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 37 + shift) % 256;
  return v;
}

// The Activations bytes a training forward of `batch` x `seq` tokens leaves held for its backward.
int64_t saved_activation_bytes(bool bf16_products, int64_t batch, int64_t seq) {
  int64_t held = 0;
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    ModelExecution execution;
    execution.moe.path = "local";  // f32 rows to the experts, saved alike in both runs
    execution.bf16_products = bf16_products;
    MoeTransformer model(ModelConfig::preset("tiny"), execution, *group, batch * seq);
    model.init(3);
    model.refresh_bf16_copies();
    const int n = static_cast<int>(batch * seq);
    const int64_t before = current_tracker().snapshot().current_of(MemCategory::Activations);
    MoeTransformer::Pending pending =
        model.forward_train(some_tokens(n, 1), some_tokens(n, 2), batch, seq, batch * seq);
    held = current_tracker().snapshot().current_of(MemCategory::Activations) - before;
    model.backward(pending);
  });
  return held;
}

TEST(Bf16TrainingMemory, ActivationsOnlyBf16ProductsReadAreSavedInBf16) {
  if (const std::string why = testing::bf16_training_skip(Products::Bf16); !why.empty()) GTEST_SKIP() << why;
  const ModelConfig m = ModelConfig::preset("tiny");
  const int64_t batch = 2, seq = 16, n = batch * seq;
  const int64_t d = m.model_dim, qd = m.heads * m.head_dim;
  ASSERT_GT(m.shared_expert_hidden, 0) << "the case must have a shared expert";
  ASSERT_EQ(ModelExecution{}.moe.capacity.rule, CapacityRule::Dropless)
      << "every route must reach its expert";
  const int64_t f32 = saved_activation_bytes(false, batch, seq),
                bf16 = saved_activation_bytes(true, batch, seq);
  ASSERT_GT(f32, 0);
  // Per block: attention's input [n, d] and context [n, qd]; the routed experts' gate and up pre-activations,
  // one row each per route (n·top_k rows, dropless) at the saved row stride, and the shared expert's (n
  // rows); once: the LM head's input [n, d]. Each held as f32 (4 bytes) with f32 products and as BF16 (2
  // bytes) with BF16 products.
  const int64_t routed_pre = 2 * n * m.moe.router.top_k * padded_stride(m.moe.hidden_dim);
  const int64_t shared_pre = 2 * n * padded_stride(m.shared_expert_hidden);
  const int64_t saved_elements = m.layers * (n * d + n * qd + routed_pre + shared_pre) + n * d;
  EXPECT_EQ(f32 - bf16, 2 * saved_elements) << "f32 products held " << f32 << " B, BF16 products " << bf16;
}

}  // namespace
}  // namespace expar
