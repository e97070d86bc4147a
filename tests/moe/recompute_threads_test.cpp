// Activation recomputation of the MoE layer (seed 000 §5.7, Figures 21 and 22), on the threads backend:
//  - with recomputation, y, grad_x and every parameter gradient are bit-identical to the layer without it,
//    for ranks 1..4, paths block, rowwise and aggregated (and agrs), dropless and with capacity drops, under
//    the microbatch schedule F1 F2 B2 B1;
//  - a recomputing forward keeps no rowwise dispatch lease (the payload goes to the pool's shared dispatch
//    scratch slot), so the only lease left is the short expert-input-gradient lease of a backward, and it
//    keeps no expert activations (tracked Activations bytes held between forward and backward drop by at
//    least w1·x and w3·x);
//  - a caller that put the dispatch payload in scratch but skipped the recomputation reads a payload a later
//    forward overwrote, and the pool's generation check says so instead of feeding Wgrad stale rows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/moe_layer.hpp"

namespace expar {
namespace {

// Fresh float tensors and symmetric buffers start as NaN: a recomputation that read a row nobody wrote
// would show up as a non-finite (and so different) result.
const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kExperts = 12, kTopK = 2;  // 12: divisible by every EP degree 1..4
constexpr int64_t kD = 8, kH = 12, kMaxTokens = 9;

int64_t tokens_of(int rank, int microbatch) {
  return 4 + (rank * 3 + microbatch) % 6;  // uneven over ranks and microbatches, at most kMaxTokens
}

Tensor tensor_of(int rank, int microbatch, uint64_t stream) {
  Tensor t = Tensor::empty({tokens_of(rank, microbatch), kD});
  fill_normal(t, 4242, stream * 64 + static_cast<uint64_t>(rank * 8 + microbatch), 1.0f);
  return t;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

struct Case {
  int ranks = 1;
  std::string path;
  bool capacity = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.path << " on " << c.ranks << " ranks" << (c.capacity ? " with capacity drops" : "");
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return fmt::format("W{}_{}_{}", info.param.ranks, info.param.path,
                     info.param.capacity ? "capacity" : "dropless");
}

MoeConfig config_of(const Case& c) {
  MoeConfig cfg;
  cfg.router.num_experts = kExperts;
  cfg.router.top_k = kTopK;
  cfg.model_dim = kD;
  cfg.hidden_dim = kH;
  cfg.router.aux_loss_coef = 1e-2;  // the router's gradient paths are part of what must match
  cfg.router.z_loss_coef = 1e-3;
  return cfg;
}

MoeExecution execution_of(const Case& c) {
  MoeExecution e;
  e.path = c.path;
  if (c.capacity) e.capacity = CapacityPolicy::with(CapacityRule::Source, 0.5);
  return e;
}

struct LayerRun {
  std::vector<std::vector<float>> y, grad_x;  // per microbatch 1, 2
  std::vector<float> w_router, w1, w3, w2;
  int leased_after_forwards = 0, high_water = 0, slot_count = 0, scratch_count = 0;
  int64_t activations_held = 0;  // tracked Activations bytes added by the two forwards, before any backward
  int64_t expert_rows = 0;       // received rows of both microbatches (w1·x and w3·x are [rows, h] each)
  int64_t dropped = 0;
};

// F1 F2 B2 B1 on one layer with a heap and lease pool shared as a model would share them.
LayerRun run_schedule(Comm& world, const Case& c, bool recompute) {
  auto heap = world.make_heap();
  const int64_t rows = world.size() * kMaxTokens * kTopK;  // dropless bound (min(K, E_L) <= K)
  LeasePool pool(*heap, "moe.dispatch", static_cast<size_t>(rows * kD) * sizeof(float));
  MoeLayer layer(config_of(c), execution_of(c), world, "moe", MoeSharedResources{heap.get(), &pool, 0});
  layer.init_params(17);
  layer.zero_grads();
  layer.set_recompute(recompute);
  EXPECT_EQ(layer.recompute(), recompute);
  Tensor x[2] = {tensor_of(world.rank(), 1, 1), tensor_of(world.rank(), 2, 1)};
  Tensor grad_y[2] = {tensor_of(world.rank(), 1, 2), tensor_of(world.rank(), 2, 2)};
  LayerRun r;
  r.y.resize(2);
  r.grad_x.resize(2);
  MoeState states[2];
  const int64_t before = current_tracker().snapshot().current_of(MemCategory::Activations);
  for (int mb = 0; mb < 2; ++mb) {
    r.y[static_cast<size_t>(mb)] = values(layer.forward(x[mb], states[mb]));  // y itself is not kept
    EXPECT_EQ(states[mb].recomputed, recompute);
    r.expert_rows += states[mb].routes.recv_rows;
    r.dropped += states[mb].routes.dropped;
  }
  r.activations_held = current_tracker().snapshot().current_of(MemCategory::Activations) - before;
  r.leased_after_forwards = pool.leased_count();
  for (int mb = 1; mb >= 0; --mb)
    r.grad_x[static_cast<size_t>(mb)] = values(layer.backward(grad_y[mb], states[mb]));
  EXPECT_EQ(pool.leased_count(), 0) << "every lease is returned by its backward";
  r.high_water = pool.high_water();
  r.slot_count = pool.slot_count();
  r.scratch_count = pool.scratch_count();
  r.w_router = values(layer.grads().w_router);
  r.w1 = values(layer.grads().experts.w1);
  r.w3 = values(layer.grads().experts.w3);
  r.w2 = values(layer.grads().experts.w2);
  return r;
}

class RecomputeTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeTest, GradientsAreBitIdenticalAndRecomputedPayloadsTakeNoLease) {
  const Case c = GetParam();
  LaunchOptions launch;
  launch.ranks = c.ranks;
  launch.timeout_seconds = 120;
  run_ranks(launch, [&](Comm& world) {
    const LayerRun kept = run_schedule(world, c, false);
    const LayerRun recomputed = run_schedule(world, c, true);
    for (size_t mb = 0; mb < 2; ++mb) {
      ASSERT_EQ(kept.y[mb].size(),
                static_cast<size_t>(tokens_of(world.rank(), static_cast<int>(mb) + 1) * kD));
      EXPECT_EQ(kept.y[mb], recomputed.y[mb]) << "microbatch " << mb + 1 << " rank " << world.rank();
      EXPECT_EQ(kept.grad_x[mb], recomputed.grad_x[mb])
          << "microbatch " << mb + 1 << " rank " << world.rank();
    }
    EXPECT_EQ(kept.w_router, recomputed.w_router) << "rank " << world.rank();
    EXPECT_EQ(kept.w1, recomputed.w1) << "rank " << world.rank();
    EXPECT_EQ(kept.w3, recomputed.w3) << "rank " << world.rank();
    EXPECT_EQ(kept.w2, recomputed.w2) << "rank " << world.rank();
    EXPECT_EQ(kept.dropped, recomputed.dropped);
    if (c.capacity && world.size() > 1) {
      // The capacity case must really drop somewhere in the group, or it tests nothing more than dropless.
      int64_t dropped = kept.dropped;
      world.all_reduce(&dropped, 1, DType::I64, ReduceOp::Sum);
      EXPECT_GT(dropped, 0);
    }

    // The expert activations (w1·x, w3·x: [rows, h] f32 each) are not kept between forward and backward.
    EXPECT_GE(kept.activations_held - recomputed.activations_held,
              2 * kept.expert_rows * kH * static_cast<int64_t>(sizeof(float)));

    if (c.path == "rowwise") {
      // Kept: one leased dispatch slot per microbatch in flight, plus the gradient lease of a backward.
      EXPECT_EQ(kept.leased_after_forwards, 2);
      EXPECT_EQ(kept.high_water, 3);
      EXPECT_EQ(kept.slot_count, 3);
      EXPECT_EQ(kept.scratch_count, 1);  // the expert-output scratch
      // Recomputed: the payloads sit in the shared dispatch scratch slot; the only lease is the
      // expert-input-gradient one, held inside one block's backward.
      EXPECT_EQ(recomputed.leased_after_forwards, 0);
      EXPECT_EQ(recomputed.high_water, 1);
      EXPECT_EQ(recomputed.slot_count, 1);
      EXPECT_EQ(recomputed.scratch_count, 2);
    } else if (c.path == "aggregated") {
      // Kept: as rowwise (a dispatch lease per microbatch in flight, the gradient lease of a backward, the
      // expert-output scratch).
      EXPECT_EQ(kept.leased_after_forwards, 2);
      EXPECT_EQ(kept.high_water, 3);
      EXPECT_EQ(kept.slot_count, 3);
      EXPECT_EQ(kept.scratch_count, 1);
      // Recomputed: the dropped forward state gave its dispatch lease back; the re-dispatch leases again
      // (aggregated has no dispatch scratch), beside the gradient lease, inside one block's backward.
      EXPECT_EQ(recomputed.leased_after_forwards, 0);
      EXPECT_EQ(recomputed.high_water, 2);
      EXPECT_EQ(recomputed.slot_count, 2);
      EXPECT_EQ(recomputed.scratch_count, 1);
    } else {
      // Other paths never touch the shared pool.
      EXPECT_EQ(kept.slot_count + kept.scratch_count + recomputed.slot_count + recomputed.scratch_count, 0);
    }
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int w = 1; w <= 4; ++w)
    for (const char* path : {"block", "rowwise", "aggregated"})
      for (bool cap : {false, true}) cases.push_back({w, path, cap});
  cases.push_back({2, "agrs", false});
  cases.push_back({1, "local", true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RecomputeTest, ::testing::ValuesIn(all_cases()), case_name);

// A state whose forward ran with recomputation keeps neither path state nor expert activations.
TEST(MoeRecompute, ARecomputingForwardDropsThePathStateAndExpertActivations) {
  run_ranks(2, [](Comm& world) {
    const Case c{2, "rowwise", false};
    MoeLayer layer(config_of(c), execution_of(c), world, "moe");
    layer.init_params(3);
    layer.set_recompute(true);
    MoeState state;
    layer.forward(tensor_of(world.rank(), 1, 1), state);
    EXPECT_TRUE(state.recomputed);
    EXPECT_EQ(state.path.path_data, nullptr);
    EXPECT_FALSE(state.path.combine_rows.defined());
    EXPECT_FALSE(state.experts.gate_pre.defined());
    EXPECT_FALSE(state.experts.up_pre.defined());
    EXPECT_FALSE(state.experts.input.defined());
    EXPECT_TRUE(state.router.x.defined()) << "the input is what the recomputation starts from";
    // Switching the layer off afterwards does not change how this state's backward runs.
    layer.set_recompute(false);
    Tensor grad_x = layer.backward(tensor_of(world.rank(), 1, 2), state);
    EXPECT_EQ(grad_x.dim(0), tokens_of(world.rank(), 1));
    for (float v : values(grad_x)) ASSERT_TRUE(std::isfinite(v));
  });
}

// Figure 21's hazard under a scratch dispatch payload: two forwards put their payloads in the one shared
// dispatch scratch slot, and the first one's backward runs WITHOUT recomputing it. The generation check
// refuses before anything reads the overwritten rows; the latest payload is intact and its backward runs.
TEST(MoeRecompute, AScratchPayloadThatWasNotRecomputedIsCaught) {
  run_ranks(2, [](Comm& world) {
    const ExpertPlacement placement(4, 2);
    auto heap = world.make_heap();
    const int64_t t_count = 3 + world.rank(), d = 4;
    Tensor idx = Tensor::empty({t_count, 2}, DType::I32);
    for (int64_t t = 0; t < t_count; ++t) {
      idx.data<int32_t>()[t * 2] = static_cast<int32_t>(t % 4);
      idx.data<int32_t>()[t * 2 + 1] = static_cast<int32_t>((t + 1 + world.rank()) % 4);
    }
    const RouteMap map = build_route_map(idx, world, placement, CapacityPolicy::dropless());
    LeasePool pool(*heap, "shared", static_cast<size_t>(map.capacity_rows * d) * sizeof(float));
    PathOptions options;
    options.model_dim = d;
    options.top_k = 2;
    options.placement = &placement;
    options.heap = heap.get();
    options.lease_pool = &pool;
    options.block_index = 0;
    auto path = make_path("rowwise", world, options);
    Tensor w = Tensor::empty({t_count, 2});
    fill_uniform(w, 8, static_cast<uint64_t>(world.rank()), 0.1f, 1.0f);
    PathState states[2];
    for (int mb = 0; mb < 2; ++mb) {
      states[mb].scratch_dispatch = true;
      Tensor x = Tensor::empty({t_count, d});
      fill_normal(x, 8, 10 + static_cast<uint64_t>(mb * 4 + world.rank()), 1.0f);
      Tensor in = path->dispatch_forward(x, map, states[mb]);
      Tensor out = path->expert_output_buffer(map, d, states[mb]);
      std::memcpy(out.raw(), in.raw(), static_cast<size_t>(map.recv_rows * d) * sizeof(float));
      path->combine_forward(out, w, map, states[mb]);
    }
    EXPECT_EQ(pool.leased_count(), 0) << "scratch payloads hold no lease";
    Tensor grad_y = Tensor::zeros({t_count, d});
    Tensor grad_w;
    try {
      path->combine_backward(grad_y, w, map, states[0], grad_w);
      ADD_FAILURE() << "the first payload was overwritten by the second forward but its backward ran";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("overwritten"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("shared scratch slot 1"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("recompute"));
    }
    Tensor grad_out = path->combine_backward(grad_y, w, map, states[1], grad_w);
    Tensor grad_in = path->expert_grad_input_buffer(map, d, states[1]);
    std::memcpy(grad_in.raw(), grad_out.raw(), static_cast<size_t>(map.recv_rows * d) * sizeof(float));
    Tensor grad_x = path->dispatch_backward(grad_in, map, states[1]);
    for (float v : values(grad_x)) EXPECT_EQ(v, 0.0f);
    EXPECT_EQ(pool.leased_count(), 0);
    EXPECT_EQ(pool.high_water(), 1) << "only the expert-input-gradient lease";
  });
}

}  // namespace
}  // namespace expar
