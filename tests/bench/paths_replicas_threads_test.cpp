// `expar bench paths --router-skew S --redundant-experts R` runs the same layer as without replicas: the
// benchmark's own layer (make_bench_layer) with the slot table it measures (measured_expert_slots) gives
// every EP path the outputs and input gradients of the same layer without replicas, on uneven token counts
// with poisoned buffers, and the table spreads the skewed load (the hottest expert replicated, the rows per
// rank closer to even). Bits may differ (a replica multiplies fewer rows: oneDNN picks kernels by m;
// moe/expert_slots_threads_test.cpp has the bit-exact cases), so the comparison is at 1e-5 of the largest
// element (agrs sums per owning rank: a small element of a cancelling sum moves by more than 1e-5 of itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/close.hpp"
#include "expar/bench/paths.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/router_skew.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar::bench {
namespace {

const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

PathsBenchOptions skewed_options() {
  PathsBenchOptions o;
  o.ranks = 4;
  o.model_dim = 32;
  o.hidden_dim = 16;
  o.experts = 16;
  o.top_k = 2;
  o.seed = 4242;
  o.router_skew = 1.0;
  o.redundant_experts = 4;
  o.oversubscribe = true;  // 4 ranks on a machine of any size
  return o;
}

int64_t tokens_of(int rank) {
  static const int64_t t[] = {96, 40, 130, 0};  // uneven, and rank 3 has none
  return t[rank];
}

struct Pass {
  Tensor y, grad_x;
  int64_t rows = 0;  // rows this rank's experts computed
};

Pass run_layer(Comm& world, const PathsBenchOptions& o, const std::string& path,
               const std::vector<int>& slots) {
  const std::unique_ptr<MoeLayer> layer = make_bench_layer(world, o, path, slots);
  Tensor x = Tensor::empty({tokens_of(world.rank()), o.model_dim});
  Tensor grad_y = Tensor::empty({tokens_of(world.rank()), o.model_dim});
  fill_normal(x, 99, static_cast<uint64_t>(world.rank()), 1.0f);
  fill_normal(grad_y, 99, 100 + static_cast<uint64_t>(world.rank()), 1.0f);
  MoeState state;
  layer->zero_grads();
  Pass p;
  p.y = layer->forward(x, state);
  p.rows = state.routes.recv_rows;
  p.grad_x = layer->backward(grad_y, state);
  return p;
}

TEST(BenchPathsReplicas, EveryEpPathGivesTheSameOutputsWithReplicas) {
  const PathsBenchOptions with = skewed_options();
  PathsBenchOptions without = with;
  without.redundant_experts = 0;
  std::vector<int> table;
  std::mutex mutex;
  std::vector<std::string> failures;
  LaunchOptions launch;
  launch.ranks = 4;
  run_ranks(launch, [&](Comm& world) {
    const std::vector<int> slots = measured_expert_slots(world, with);
    EXPECT_TRUE(measured_expert_slots(world, without).empty());
    if (world.rank() == 0) table = slots;
    for (const std::string& path : benchmarked_paths({})) {
      if (path_traits(path).single_rank) continue;
      const Pass a = run_layer(world, without, path, {});
      const Pass b = run_layer(world, with, path, slots);
      const auto tol = test::Tolerance::relative_to_largest(1e-5);
      EXPECT_TRUE(test::close(b.y, a.y, tol)) << path << " y, rank " << world.rank();
      EXPECT_TRUE(test::close(b.grad_x, a.grad_x, tol)) << path << " grad_x, rank " << world.rank();
      // The rows per rank: the replicas must spread them.
      std::vector<double> rows_a(4), rows_b(4);
      const double mine[2] = {static_cast<double>(a.rows), static_cast<double>(b.rows)};
      world.all_gather(&mine[0], rows_a.data(), 1, DType::F64);
      world.all_gather(&mine[1], rows_b.data(), 1, DType::F64);
      if (world.rank() == 0) {
        std::lock_guard lock(mutex);
        if (!(load_imbalance(rows_b) < load_imbalance(rows_a)))
          failures.push_back(path + ": imbalance " + std::to_string(load_imbalance(rows_b)) +
                             " with replicas, " + std::to_string(load_imbalance(rows_a)) + " without");
      }
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
  ASSERT_EQ(table.size(), 20u);
  // The expert the skew makes hottest (rank 1) has replicas.
  const std::vector<int> ranks = router_skew_ranks(with.experts, with.seed, 0);
  const int hottest = static_cast<int>(std::find(ranks.begin(), ranks.end(), 1) - ranks.begin());
  EXPECT_GE(std::count(table.begin(), table.end(), hottest), 2) << "expert " << hottest;
}

TEST(BenchPathsReplicas, RefusesSlotsTheEpDegreeDoesNotDivideAndBadSkews) {
  PathsBenchOptions o = skewed_options();
  o.redundant_experts = 3;
  try {
    validate(o);
    ADD_FAILURE() << "R = 3 with E = 16 over EP 4 must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--redundant-experts 3"), std::string::npos) << m;
    EXPECT_NE(m.find("pass --redundant-experts 0 or 4"), std::string::npos) << m;
    o.redundant_experts = 4;
    EXPECT_NO_THROW(validate(o)) << "the suggested value must be accepted";
  }
  o.router_skew = -1;
  try {
    validate(o);
    ADD_FAILURE() << "a negative skew must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--router-skew -1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace expar::bench
