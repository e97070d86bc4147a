// The agrs path's collective levels (path.hpp AgrsLevel) and route maps whose sources are not the expert
// partitions (route_map.hpp), forward and backward, against a host reference on 4 ranks arranged as
// TP 2 x DP 2 (rank = dp * 2 + tp), as inference uses them:
//  - prefill form: levels {TP gathering, DP gathering}, the map's sources the 4 ranks in world order;
//  - decode form: levels {TP replicated, DP gathering}, each TP pair holding its replica's tokens and the
//    map's sources the 2 replicas;
//  - variable EP: 2 partitions of 2 ranks each, every rank of a partition computing half of each expert
//    (the reduction adds the halves);
//  - an addend joining the TP reduction is summed exactly once per TP rank.
// The experts are linear (expert e scales its rows by its half's factor), so the reference is a closed form:
// y[t] = Σ_k w[t,k]·s(e)·x[t], grad_x[t] = Σ_k w[t,k]·s(e)·gy[t], grad_w[t,k] = s(e)·dot(gy[t], x[t]),
// with s(e) = 1 + e/8 summed over the shards. Fresh float tensors start as NaN (EXPAR_POISON), so a row read
// that nobody wrote shows up.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/close.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/route_map.hpp"

namespace expar {
namespace {

const bool kPoison = [] {
  setenv("EXPAR_POISON", "1", 1);
  return true;
}();

constexpr int kExperts = 8, kTopK = 2;
constexpr int64_t kD = 8;

// Expert e's factor on a rank that holds shard `shard` of `shards`: the shards' factors add up to s(e).
float factor(int e, int shard, int shards) {
  const float whole = 1.0f + static_cast<float>(e) / 8.0f;
  return shards == 1 ? whole : (shard == 0 ? 0.25f * whole : 0.75f * whole);
}

struct Inputs {
  Tensor x, idx, weight, grad_y;
};

// Tokens of source `source` (distinct experts per token, positive weights).
Inputs inputs_of(int source, int64_t tokens) {
  Inputs in;
  in.x = Tensor::empty({tokens, kD});
  fill_normal(in.x, 77, static_cast<uint64_t>(source), 1.0f);
  in.grad_y = Tensor::empty({tokens, kD});
  fill_normal(in.grad_y, 78, static_cast<uint64_t>(source), 1.0f);
  in.idx = Tensor::empty({tokens, kTopK}, DType::I32);
  in.weight = Tensor::empty({tokens, kTopK});
  for (int64_t t = 0; t < tokens; ++t) {
    const auto first = static_cast<int32_t>((source * 5 + t * 3) % kExperts);
    in.idx.data<int32_t>()[t * kTopK] = first;
    in.idx.data<int32_t>()[t * kTopK + 1] = (first + 1 + static_cast<int32_t>(t % 3)) % kExperts;
    in.weight.data<float>()[t * kTopK] = 0.6f;
    in.weight.data<float>()[t * kTopK + 1] = 0.4f;
  }
  return in;
}

// Runs the linear experts of this rank's partition on the expert-side rows [0, recv_rows).
Tensor run_experts(const Tensor& rows, const RouteMap& map, const ExpertPlacement& placement, int shard,
                   int shards) {
  Tensor out = Tensor::empty({map.capacity_rows, kD});
  const std::vector<int> local = placement.local_experts(map.partition);
  for (size_t l = 0; l < local.size(); ++l) {
    const float f = factor(local[l], shard, shards);
    for (int64_t r = map.expert_offsets[l]; r < map.expert_offsets[l + 1]; ++r)
      for (int64_t j = 0; j < kD; ++j) out.data<float>()[r * kD + j] = f * rows.data<float>()[r * kD + j];
  }
  return out;
}

// The closed form in double against the path's f32 result.
const test::Tolerance kClose = test::Tolerance::abs_plus_rel(1e-5, 1e-5);

// One forward and backward step; checks y, grad_x and grad_topk_weight against the closed form. `extra`
// is what the addend adds to every y element (0 without one).
void check_step(ExpertPath& path, const Inputs& in, const RouteMap& map, const ExpertPlacement& placement,
                int shard, int shards, PathState& state, float extra) {
  Tensor expert_in = path.dispatch_forward(in.x, map, state);
  Tensor expert_out = run_experts(expert_in, map, placement, shard, shards);
  Tensor y = path.combine_forward(expert_out, in.weight, map, state);
  Tensor grad_w;
  Tensor grad_out = path.combine_backward(in.grad_y, in.weight, map, state, grad_w);
  Tensor grad_in = run_experts(grad_out, map, placement, shard, shards);
  Tensor grad_x = path.dispatch_backward(grad_in, map, state);
  ASSERT_EQ(y.dim(0), in.x.dim(0));
  for (int64_t t = 0; t < in.x.dim(0); ++t) {
    double dot = 0.0;
    for (int64_t j = 0; j < kD; ++j)
      dot += double{in.grad_y.data<float>()[t * kD + j]} * in.x.data<float>()[t * kD + j];
    for (int64_t j = 0; j < kD; ++j) {
      double want_y = extra, want_gx = 0.0;
      for (int k = 0; k < kTopK; ++k) {
        const int e = in.idx.data<int32_t>()[t * kTopK + k];
        const double s = factor(e, 0, 1), w = in.weight.data<float>()[t * kTopK + k];
        want_y += w * s * in.x.data<float>()[t * kD + j];
        want_gx += w * s * in.grad_y.data<float>()[t * kD + j];
      }
      EXPECT_TRUE(test::close(y.data<float>()[t * kD + j], want_y, kClose))
          << "y token " << t << " column " << j;
      EXPECT_TRUE(test::close(grad_x.data<float>()[t * kD + j], want_gx, kClose))
          << "grad_x token " << t << " column " << j;
    }
    for (int k = 0; k < kTopK; ++k)
      EXPECT_TRUE(test::close(grad_w.data<float>()[t * kTopK + k],
                              factor(in.idx.data<int32_t>()[t * kTopK + k], 0, 1) * dot, kClose))
          << "grad_w token " << t << " route " << k;
  }
}

const std::vector<int64_t> kTokens = {5, 0, 7, 3};  // per world rank (prefill); rank 1 has none

struct Groups {
  std::shared_ptr<Comm> tp, dp;
};
Groups make_groups(Comm& world) {
  return {world.subgroup({{0, 1}, {2, 3}}, "tp"), world.subgroup({{0, 2}, {1, 3}}, "dp")};
}

// The agrs path over {TP, DP}, TP gathered (prefill) or replicated (decode), DP gathered.
PathOptions agrs_options(const ExpertPlacement& placement, const Groups& g, bool tp_replicated) {
  PathOptions po;
  po.model_dim = kD;
  po.top_k = kTopK;
  po.placement = &placement;
  po.agrs_levels = {{g.tp.get(), tp_replicated}, {g.dp.get(), false}};
  return po;
}

// Prefill form, full EP (4 partitions, one per rank) and variable EP (2 partitions of 2 ranks, each rank
// half of each expert).
TEST(AgrsLevels, PrefillGathersOverTpThenDp) {
  for (const int partitions : {4, 2}) {
    SCOPED_TRACE(partitions == 4 ? "full EP" : "variable EP");
    run_ranks(4, [&](Comm& world) {
      Groups g = make_groups(world);
      const ExpertPlacement placement(kExperts, partitions);
      const int shards = 4 / partitions, partition = world.rank() / shards, shard = world.rank() % shards;
      const Inputs in = inputs_of(world.rank(), kTokens[static_cast<size_t>(world.rank())]);
      const RouteMap map = build_route_map(in.idx, world, placement, CapacityPolicy::dropless(), partition);
      EXPECT_EQ(map.partitions, partitions);
      const PathOptions po = agrs_options(placement, g, /*tp_replicated=*/false);
      auto path = make_path("agrs", *g.tp, po);
      PathState state;
      state.agrs.topk_weight = &in.weight;  // the weights travel with the rows
      check_step(*path, in, map, placement, shard, shards, state, 0.0f);
      EXPECT_EQ(state.agrs.gathered_tokens.dim(0), 15);  // every source's tokens
    });
  }
}

// Decode form: the TP pair {2r, 2r+1} holds replica r's tokens; the replicas are the map's two sources.
// The addend (this replica's rows, 0.5 on each TP rank) joins the TP all-reduce: y gains exactly 1.0.
TEST(AgrsLevels, DecodeReplicatesTpAndGathersDp) {
  run_ranks(4, [&](Comm& world) {
    Groups g = make_groups(world);
    const ExpertPlacement placement(kExperts, 4);
    const int replica = world.rank() / 2;
    const std::vector<int64_t> replica_tokens = {4, 3};
    const Inputs in = inputs_of(10 + replica, replica_tokens[static_cast<size_t>(replica)]);
    const RouteMap map = build_route_map(in.idx, *g.dp, placement, CapacityPolicy::dropless(), world.rank());
    EXPECT_EQ(map.ep_size, 2);
    const PathOptions po = agrs_options(placement, g, /*tp_replicated=*/true);
    auto path = make_path("agrs", *g.tp, po);
    PathState state;
    const int64_t offset = replica == 0 ? 0 : replica_tokens[0];
    state.agrs.combine_addend = Tensor::empty({in.x.dim(0), kD});
    for (int64_t i = 0; i < state.agrs.combine_addend.numel(); ++i)
      state.agrs.combine_addend.data<float>()[i] = 0.5f;
    state.agrs.addend_row = offset;
    state.agrs.addend_level = 0;
    check_step(*path, in, map, placement, 0, 1, state, 1.0f);
  });
}

// A map whose sources are not the gathering ranks, or in another order, is refused by name; block refuses
// maps with partitions of several ranks.
TEST(AgrsLevels, RefusesMapsThatDoNotMatchTheLevels) {
  run_ranks(4, [&](Comm& world) {
    Groups g = make_groups(world);
    const ExpertPlacement placement(kExperts, 2);
    const Inputs in = inputs_of(world.rank(), 2);
    const PathOptions po = agrs_options(placement, g, /*tp_replicated=*/false);
    auto path = make_path("agrs", *g.tp, po);
    // Sources over the TP pair only: 2 sources for a path that gathers 4.
    const RouteMap pair =
        build_route_map(in.idx, *g.tp, placement, CapacityPolicy::dropless(), world.rank() / 2);
    PathState state;
    try {
      path->dispatch_forward(in.x, pair, state);
      ADD_FAILURE() << "a map over 2 sources was accepted by a path gathering over 4";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("build the map over the gathering ranks"), std::string::npos)
          << e.what();
    }
    const RouteMap all =
        build_route_map(in.idx, world, placement, CapacityPolicy::dropless(), world.rank() / 2);
    const ExpertPlacement per_rank(kExperts, 4);  // what block's group needs; the map says 2 partitions
    PathOptions block_options = po;
    block_options.placement = &per_rank;
    block_options.agrs_levels.clear();
    auto block = make_path("block", world, block_options);
    PathState block_state;
    try {
      block->dispatch_forward(in.x, all, block_state);
      ADD_FAILURE() << "block accepted a map with partitions of several ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("one partition per source rank"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace expar
