// Phase timing hooks: a bound timer records the Table 7 phases of each path in both passes, an unbound
// scope records nothing, ranks' timers are independent, and timing never changes what a path computes.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {
namespace {

TEST(PhaseTimer, AccumulatesByNameInFirstSeenOrder) {
  PhaseTimer timer;
  timer.add("b", 1.0);
  timer.add("a", 0.25);
  timer.add("b", 0.5);
  ASSERT_EQ(timer.phases().size(), 2u);
  EXPECT_EQ(timer.phases()[0].first, "b");
  EXPECT_EQ(timer.phases()[1].first, "a");
  EXPECT_DOUBLE_EQ(timer.seconds("b"), 1.5);
  EXPECT_DOUBLE_EQ(timer.seconds("a"), 0.25);
  EXPECT_DOUBLE_EQ(timer.seconds("never"), 0.0);
  EXPECT_DOUBLE_EQ(timer.total(), 1.75);
  timer.clear();
  EXPECT_TRUE(timer.phases().empty());
}

TEST(PhaseTimer, ScopeRecordsOnlyWhileBoundAndStopsOnce) {
  PhaseTimer timer;
  { PhaseScope unbound("x"); }
  EXPECT_TRUE(timer.phases().empty());
  EXPECT_EQ(bound_phase_timer(), nullptr);
  {
    PhaseTimerBinding bind(&timer);
    EXPECT_EQ(bound_phase_timer(), &timer);
    PhaseScope scope("x");
    scope.stop();
    scope.stop();  // a second stop adds nothing
    PhaseTimer inner;
    {
      PhaseTimerBinding nested(&inner);
      PhaseScope other("y");
    }
    EXPECT_EQ(bound_phase_timer(), &timer);
    EXPECT_EQ(inner.phases().size(), 1u);
  }
  EXPECT_EQ(bound_phase_timer(), nullptr);
  ASSERT_EQ(timer.phases().size(), 1u);
  EXPECT_EQ(timer.phases()[0].first, "x");
  EXPECT_GE(timer.seconds("x"), 0.0);
}

MoeConfig config() {
  MoeConfig c;
  c.router.num_experts = 4;
  c.router.top_k = 2;
  c.model_dim = 8;
  c.hidden_dim = 6;
  return c;
}

MoeExecution execution_of(const std::string& path) {
  MoeExecution e;
  e.path = path;
  return e;
}

struct StepResult {
  std::vector<float> y, grad_x, grad_w1;
  std::set<std::string> forward_phases, backward_phases;
};

std::vector<float> copy_of(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.raw(), v.size() * sizeof(float));
  return v;
}

StepResult run_step(Comm& group, const std::string& path, int rank, bool timed, bool sync = false) {
  MoeLayer layer(config(), execution_of(path), group);
  layer.init_params(11);
  Tensor x = Tensor::empty({5, 8}), grad_y = Tensor::empty({5, 8});
  fill_normal(x, 3, 100 + static_cast<uint64_t>(rank), 1.0f);
  fill_normal(grad_y, 4, 200 + static_cast<uint64_t>(rank), 1.0f);
  PhaseTimer forward_timer, backward_timer;
  forward_timer.set_sync_comm(sync);
  backward_timer.set_sync_comm(sync);
  MoeState state;
  StepResult r;
  {
    PhaseTimerBinding bind(timed ? &forward_timer : nullptr);
    r.y = copy_of(layer.forward(x, state));
  }
  {
    PhaseTimerBinding bind(timed ? &backward_timer : nullptr);
    r.grad_x = copy_of(layer.backward(grad_y, state));
  }
  r.grad_w1 = copy_of(layer.grads().experts.w1);
  for (const auto& p : forward_timer.phases()) r.forward_phases.insert(p.first);
  for (const auto& p : backward_timer.phases()) r.backward_phases.insert(p.first);
  return r;
}

using Names = std::set<std::string>;

TEST(PhaseTimer, PathsRecordTheirPhasesAndTimingChangesNothing) {
  const Names block = {phase::kRouter,           phase::kRouteMap,        phase::kLocalPermute,
                       phase::kAllToAllDispatch, phase::kGlobalPermute,   phase::kGroupedGemm,
                       phase::kGlobalUnpermute,  phase::kAllToAllCombine, phase::kLocalUnpermuteMerge};
  const Names rowwise = {phase::kRouter, phase::kRouteMap, phase::kRowDispatch, phase::kGroupedGemm,
                         phase::kRowGatherReduce};
  const Names agrs = {phase::kRouter,      phase::kRouteMap,     phase::kAllGather,    phase::kRowCopy,
                      phase::kGroupedGemm, phase::kPartialMerge, phase::kReduceScatter};
  const Names local = {phase::kRouter, phase::kRouteMap, phase::kLocalPermute, phase::kGroupedGemm,
                       phase::kLocalUnpermuteMerge};
  // The backward of the block path runs every movement's adjoint, so it shows the same phases minus the
  // route-map build; agrs backward all-gathers grad_y, so it has the forward's phases too.
  auto without_route_map = [](Names n) {
    n.erase(phase::kRouteMap);
    return n;
  };
  std::mutex mutex;
  int checked = 0;
  run_ranks(2, [&](Comm& world) {
    const int rank = world.rank();
    auto solo = world.split(rank, 0, "solo");
    for (const auto& [path, names] : std::vector<std::pair<std::string, Names>>{
             {"block", block}, {"rowwise", rowwise}, {"agrs", agrs}, {"local", local}}) {
      Comm& group = path == "local" ? *solo : world;
      const StepResult plain = run_step(group, path, rank, false);
      const StepResult timed = run_step(group, path, rank, true);
      std::lock_guard lock(mutex);
      EXPECT_TRUE(plain.forward_phases.empty()) << path;
      EXPECT_EQ(timed.forward_phases, names) << path;
      EXPECT_EQ(timed.backward_phases, without_route_map(names)) << path;
      EXPECT_EQ(plain.y, timed.y) << path;
      EXPECT_EQ(plain.grad_x, timed.grad_x) << path;
      EXPECT_EQ(plain.grad_w1, timed.grad_w1) << path;
      ++checked;
    }
    // --sync-comm: every path that communicates books a barrier wait before its communication phases and
    // still computes the same values; local never communicates.
    for (const std::string path : {"block", "rowwise", "agrs", "local"}) {
      Comm& group = path == "local" ? *solo : world;
      const StepResult plain = run_step(group, path, rank, false);
      const StepResult synced = run_step(group, path, rank, true, true);
      std::lock_guard lock(mutex);
      EXPECT_EQ(synced.forward_phases.count(phase::kWait), path == "local" ? 0u : 1u) << path;
      EXPECT_EQ(synced.backward_phases.count(phase::kWait), path == "local" ? 0u : 1u) << path;
      EXPECT_EQ(plain.y, synced.y) << path;
      EXPECT_EQ(plain.grad_x, synced.grad_x) << path;
      EXPECT_EQ(plain.grad_w1, synced.grad_w1) << path;
      ++checked;
    }
  });
  EXPECT_EQ(checked, 16);
}

}  // namespace
}  // namespace expar
