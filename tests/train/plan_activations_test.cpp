// train/plan_activations' figure against the live accounting: the Activations bytes (core/memory) that a
// training forward of the tiny model leaves held for its backward, on each rank. Single rank (local path)
// and EP 2 on threads for every training path whose saved rows differ (block, rowwise, aggregated, agrs), in
// f32 and with BF16 products, dropless and with a capacity factor, with and without recomputation, and with
// q/k norms. The rows a rank's experts receive depend on the routing, which the plan counts at the capacity:
// with the model's own routing each rank holds at most the figure; with a score bias that sends every route
// to rank 0's first two experts, rank 0 receives its capacity and holds the figure exactly.
#include "expar/train/plan_activations.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "expar/model/model_shape.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/plan_activations.hpp"
#include "expar/train/plan_buffers.hpp"
#include "train/training_runs.hpp"

namespace expar {
namespace {

using testing::Products;

std::vector<int32_t> some_tokens(int n, int shift) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (i * 37 + shift) % 256;
  return v;
}

struct Case {
  int ranks = 1;
  std::string path = "local";
  Products products = Products::F32;
  double capacity_factor = 0;  // 0: dropless; else the source rule
  bool recompute = false;
  bool forced_routing = false;  // every route to experts 0 and 1 (rank 0's)
  ModelFeatures features;       // the families' attention and MLP variants
};

std::string describe(const Case& c) {
  const ModelFeatures& f = c.features;
  return fmt::format(
      "{} ranks, path {}, {} products, cf {}, recompute {}, forced routing {}, qk norm {}, latent attention "
      "{} "
      "(q_lora {}), dense MLP layers {}, shared expert gate {}",
      c.ranks, c.path, c.products == Products::F32 ? "f32" : "BF16", c.capacity_factor, c.recompute,
      c.forced_routing, static_cast<int>(f.qk_norm), f.mla.enabled(), f.mla.q_lora_rank, f.dense_mlp.size(),
      f.shared_expert_gate);
}

struct Held {
  int64_t live = 0, planned = 0;
};

// Per rank: the Activations bytes held after forward_train (before its backward), and the plan's figure.
std::vector<Held> held_after_forward(const Case& c) {
  const int64_t batch = 2, seq = 16, n = batch * seq;
  std::vector<Held> out(static_cast<size_t>(c.ranks));
  std::mutex m;
  run_ranks(c.ranks, [&](Comm& world) {
    auto group = world.split(0, world.rank(), "ep");
    ModelConfig config = ModelConfig::preset("tiny");
    config.moe.use_score_bias = c.forced_routing;
    const ModelFeatures& features = c.features;
    ModelExecution execution;
    execution.moe.path = c.path;
    execution.bf16_products = c.products == Products::Bf16;
    execution.recompute_every_moe = c.recompute;
    if (c.capacity_factor > 0)
      execution.moe.capacity = CapacityPolicy::with(CapacityRule::Source, c.capacity_factor);
    if (execution.bf16_products && path_traits(c.path).reduced_precision)
      execution.moe.precision = PayloadPrecision::uniform(PayloadFormat::BF16);
    MoeTransformer model(config, execution, *group, n, features);
    model.init(3);
    if (c.forced_routing)
      for (int l = 0; l < config.layers; ++l) {
        if (!model.has_moe(l)) continue;
        float* bias = model.moe(l).params().score_bias.data<float>();
        bias[0] = bias[1] = 1e3f;
      }
    model.refresh_bf16_copies();
    const int64_t planned = model_saved_activations(model, n, seq, 1).total();
    const int64_t before = current_tracker().snapshot().current_of(MemCategory::Activations);
    MoeTransformer::Pending pending = model.forward_train(some_tokens(static_cast<int>(n), 1 + world.rank()),
                                                          some_tokens(static_cast<int>(n), 2), batch, seq, n);
    const int64_t live = current_tracker().snapshot().current_of(MemCategory::Activations) - before;
    model.backward(pending);
    std::lock_guard lock(m);
    out[static_cast<size_t>(world.rank())] = {live, planned};
  });
  return out;
}

// `untracked`: bytes the plan counts that the memory tracker does not see (a gated shared expert's gate
// values, a std::vector).
void expect_exact_on_rank_0_and_bounded(const Case& c, int64_t untracked = 0) {
  const std::vector<Held> held = held_after_forward(c);
  for (size_t r = 0; r < held.size(); ++r) {
    ASSERT_GT(held[r].live, 0) << describe(c);
    if (r == 0 && (c.ranks == 1 || c.forced_routing)) {
      EXPECT_EQ(held[r].live + untracked, held[r].planned) << describe(c) << ", rank " << r;
    } else {
      EXPECT_LE(held[r].live, held[r].planned) << describe(c) << ", rank " << r;
    }
  }
}

bool skip_bf16(Products p) {
  return !testing::bf16_training_skip(p).empty();
}

TEST(PlanActivations, SingleRankEqualsTheLiveAccountingExactly) {
  for (Products p : {Products::F32, Products::Bf16}) {
    if (skip_bf16(p)) continue;
    for (bool recompute : {false, true})
      for (double cf : {0.0, 1.0})
        for (nn::QkNorm qk : {nn::QkNorm::None, nn::QkNorm::PerHead, nn::QkNorm::Projection}) {
          Case c;
          c.products = p;
          c.recompute = recompute;
          c.capacity_factor = cf;
          c.features.qk_norm = qk;
          expect_exact_on_rank_0_and_bounded(c);
        }
  }
}

TEST(PlanActivations, EpTwoIsABoundThatTheWorstRoutingReaches) {
  for (const char* path : {"block", "rowwise", "aggregated", "agrs"})
    for (Products p : {Products::F32, Products::Bf16}) {
      if (skip_bf16(p)) continue;
      for (double cf : {0.0, 1.0})
        for (bool forced : {false, true})
          for (bool recompute : {false, true}) {
            Case c;
            c.ranks = 2;
            c.path = path;
            c.products = p;
            c.capacity_factor = cf;
            c.forced_routing = forced;
            c.recompute = recompute;
            expect_exact_on_rank_0_and_bounded(c);
          }
    }
}

TEST(PlanActivations, TheFamiliesAttentionAndMlpVariantsAreCountedExactly) {
  const ModelConfig tiny = ModelConfig::preset("tiny");
  const int64_t n = 2 * 16;
  for (int variant = 0; variant < 6; ++variant) {
    Case c;
    ModelFeatures& f = c.features;
    int64_t untracked = 0;
    if (variant <= 1) {
      // Latent attention (f32 products only): the rope width is the model's head_dim.
      f.mla.q_lora_rank = variant == 0 ? 24 : 0;
      f.mla.kv_lora_rank = 20;
      f.mla.qk_nope_head_dim = 8;
      f.mla.qk_rope_head_dim = tiny.head_dim;
      f.mla.v_head_dim = 12;
      f.mla.softmax_scale = 0.2;
    } else if (variant == 2) {
      f.dense_mlp = {1, 0};  // the first layer dense
      f.dense_mlp_hidden = 40;
    } else if (variant == 3) {
      f.shared_expert_gate = true;
      untracked = 4 * n * tiny.layers;  // one f32 gate value per token and MoE layer
    } else if (variant == 4) {
      f.tied_embeddings = true;
      f.qkv_bias = f.o_bias = f.attention_sinks = true;
    } else {
      f.window = {8, 0};
    }
    expect_exact_on_rank_0_and_bounded(c, untracked);
    if (variant >= 2 && !skip_bf16(Products::Bf16)) {
      c.products = Products::Bf16;
      expect_exact_on_rank_0_and_bounded(c, untracked);
    }
  }
}

// The forced routing does reach the capacity: rank 0's figure exceeds rank 1's live bytes by the expert rows
// rank 1 did not receive (a check that the exact case above is the worst case, not a coincidence).
TEST(PlanActivations, TheForcedRoutingLeavesTheOtherRankWithoutExpertRows) {
  Case c;
  c.ranks = 2;
  c.path = "rowwise";
  c.forced_routing = true;
  const std::vector<Held> held = held_after_forward(c);
  const ModelConfig m = ModelConfig::preset("tiny");
  const int64_t capacity_rows = 2 * 32 * 2;  // dropless: M_E * T * min(K, E_L)
  const int64_t pre_activations = 2 * 4 * capacity_rows * (m.moe.hidden_dim + 16);
  EXPECT_EQ(held[0].live - held[1].live, m.layers * pre_activations);
}

// Context parallelism, C = 2 on 2 ranks (each its own EP group, local path): each rank holds a chunk of
// S/2 positions of both sequences; the last chunk's attention keeps the keys and values of all S positions
// and the plan counts that rank, exactly; the first holds less. Also latent attention, which gathers the
// latent rows instead.
TEST(PlanActivations, ContextParallelCountsTheLastChunk) {
  const int64_t batch = 2, seq = 32, chunk = seq / 2, n = batch * chunk;
  for (bool latent : {false, true}) {
    ModelFeatures features;
    if (latent) {
      features.mla.q_lora_rank = 24;
      features.mla.kv_lora_rank = 20;
      features.mla.qk_nope_head_dim = 8;
      features.mla.qk_rope_head_dim = ModelConfig::preset("tiny").head_dim;
      features.mla.v_head_dim = 12;
      features.mla.softmax_scale = 0.2;
    }
    std::vector<Held> held(2);
    std::mutex m;
    run_ranks(2, [&](Comm& world) {
      auto group = world.split(world.rank(), 0, "ep");
      MoeTransformer model(ModelConfig::preset("tiny"), ModelExecution{}, *group, n, features);
      model.set_context_parallel(&world, 1);
      model.init(3);
      const int64_t planned = model_saved_activations(model, n, seq, 2).total();
      const int64_t before = current_tracker().snapshot().current_of(MemCategory::Activations);
      MoeTransformer::Pending pending =
          model.forward_train(some_tokens(static_cast<int>(n), 1 + world.rank()),
                              some_tokens(static_cast<int>(n), 2), batch, chunk, n);
      const int64_t live = current_tracker().snapshot().current_of(MemCategory::Activations) - before;
      model.backward(pending);
      std::lock_guard lock(m);
      held[static_cast<size_t>(world.rank())] = {live, planned};
    });
    EXPECT_EQ(held[1].live, held[1].planned) << "latent " << latent;
    EXPECT_LT(held[0].live, held[0].planned) << "latent " << latent;
  }
}

// `expar plan`'s row (plan_training) is the figure a training forward reaches: the tiny model on 2 ranks at
// EP 2, rowwise, dropless, f32, against rank 0's live bytes under the forced routing; and it is in the total
// and the fit.
TEST(PlanActivations, ThePlanCountsThemInItsTotalAndFit) {
  Case c;
  c.ranks = 2;
  c.path = "rowwise";
  c.forced_routing = true;
  const int64_t live = held_after_forward(c)[0].live;
  PlanConfig config;
  config.model = model_shape(Architecture{ModelFormat::Expar, ModelConfig::preset("tiny"), {}}, "tiny");
  config.world = 2;
  config.ep_mp = 2;
  config.tokens_per_rank = 2 * 16;
  config.capacity_factor = 0;
  PlanBufferOptions buffers;
  buffers.seq_len = 16;
  buffers.bf16_products = false;
  const Plan plan = plan_training(config, buffers);
  ASSERT_EQ(plan.stages.size(), 1u);
  const StagePlan& s = plan.stages[0];
  EXPECT_EQ(s.activation_bytes, live);
  const StagePlan without = make_plan(config).stages[0];
  EXPECT_EQ(s.total_bytes, without.total_bytes + s.symmetric_bytes + s.activation_bytes);
  config.device_memory_bytes = s.total_bytes - 1;  // holds everything but one byte of the activations
  EXPECT_FALSE(plan_training(config, buffers).stages[0].fits);
  config.device_memory_bytes = s.total_bytes;
  EXPECT_TRUE(plan_training(config, buffers).stages[0].fits);
}

}  // namespace
}  // namespace expar
