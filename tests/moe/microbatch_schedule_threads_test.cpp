// Several microbatch forwards before their backwards (as under pipeline parallelism, seed 000 §5.7 and
// Figure 22): with the rowwise path and a lease pool shared by the blocks, the schedules F1 F2 F3 B3 B2 B1
// and F1 F2 B1 F3 B2 B3 give the same gradients as running each microbatch alone (forward then backward)
// in the same backward order, bit for bit. A frozen pool sized for one microbatch in flight refuses the
// third forward with a message that says how many slots are needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/moe_layer.hpp"

namespace expar {
namespace {

constexpr int64_t kTokens = 12, kDim = 16;

MoeConfig config() {
  MoeConfig c;
  c.router.num_experts = 8;
  c.router.top_k = 2;
  c.model_dim = kDim;
  c.hidden_dim = 24;
  return c;
}

MoeExecution rowwise() {
  MoeExecution e;
  e.path = "rowwise";
  return e;
}

Tensor input(int rank, int microbatch, uint64_t stream) {
  Tensor t = Tensor::empty({kTokens, kDim});
  fill_normal(t, 99, stream * 100 + static_cast<uint64_t>(microbatch * 8 + rank), 1.0f);
  return t;
}

struct Result {
  std::vector<std::vector<float>> grad_x;  // per microbatch
  std::vector<float> w1, w2, router;
};

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// Runs the schedule (a list of +mb for forward, -mb for backward) on `world`; each rank returns its grads.
Result run_schedule(Comm& world, const std::vector<int>& schedule) {
  auto heap = world.make_heap();
  LeasePool pool(*heap, "dispatch", static_cast<size_t>(world.size() * kTokens * 2 * kDim) * sizeof(float));
  MoeLayer layer(config(), rowwise(), world, "moe", MoeSharedResources{heap.get(), &pool, 0});
  layer.init_params(5);
  layer.zero_grads();
  std::vector<MoeState> states(4);
  Result r;
  r.grad_x.resize(4);
  for (int op : schedule) {
    const int mb = op > 0 ? op : -op;
    if (op > 0) {
      layer.forward(input(world.rank(), mb, 1), states[static_cast<size_t>(mb)]);
    } else {
      Tensor grad_x = layer.backward(input(world.rank(), mb, 2), states[static_cast<size_t>(mb)]);
      r.grad_x[static_cast<size_t>(mb)] = values(grad_x);
    }
  }
  r.w1 = values(layer.grads().experts.w1);
  r.w2 = values(layer.grads().experts.w2);
  r.router = values(layer.grads().w_router);
  return r;
}

void expect_same_schedule_result(const std::vector<int>& interleaved, const std::vector<int>& alone) {
  run_ranks(2, [&](Comm& world) {
    Result a = run_schedule(world, interleaved);
    Result b = run_schedule(world, alone);
    for (int mb = 1; mb <= 3; ++mb) {
      ASSERT_EQ(a.grad_x[static_cast<size_t>(mb)].size(), static_cast<size_t>(kTokens * kDim));
      EXPECT_EQ(a.grad_x[static_cast<size_t>(mb)], b.grad_x[static_cast<size_t>(mb)]) << "microbatch " << mb;
    }
    EXPECT_EQ(a.w1, b.w1);
    EXPECT_EQ(a.w2, b.w2);
    EXPECT_EQ(a.router, b.router);
  });
}

TEST(MicrobatchSchedule, ForwardsThenReverseBackwardsMatchEachMicrobatchAlone) {
  expect_same_schedule_result({1, 2, 3, -3, -2, -1}, {3, -3, 2, -2, 1, -1});
}

TEST(MicrobatchSchedule, InterleavedScheduleMatchesEachMicrobatchAlone) {
  expect_same_schedule_result({1, 2, -1, 3, -2, -3}, {1, -1, 2, -2, 3, -3});
}

TEST(MicrobatchSchedule, FrozenPoolRefusesMoreMicrobatchesInFlightThanItsDryRunSaw) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", static_cast<size_t>(world.size() * kTokens * 2 * kDim) * sizeof(float));
    MoeLayer layer(config(), rowwise(), world, "moe", MoeSharedResources{heap.get(), &pool, 0});
    layer.init_params(5);
    {  // dry run: one microbatch at a time
      MoeState s;
      layer.forward(input(world.rank(), 1, 1), s);
      layer.backward(input(world.rank(), 1, 2), s);
    }
    // The dry run leased two slots at once: the dispatch payload (held until backward) and, in backward,
    // the expert input-gradient rows.
    EXPECT_EQ(pool.slot_count(), 2);
    pool.freeze();
    MoeState first, second, third;
    layer.forward(input(world.rank(), 1, 1), first);
    layer.forward(input(world.rank(), 2, 1), second);
    try {
      layer.forward(input(world.rank(), 3, 1), third);
      ADD_FAILURE() << "a frozen pool handed out a leased slot or grew";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("frozen"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("3 slots needed"));
    }
  });
}

}  // namespace
}  // namespace expar
