// The rowwise path moves rows in the directions of seed 000 Table 8 (backward is the adjoint of forward,
// contract 5 of docs/design.md): its four passes, run over a heap that logs every one-sided operation its
// rank issues (tests/moe/counting_heap.hpp, which maps no peer, so every row goes through put or get).
// Per pass and per rank:
//   dispatch forward   only PUTs, one per accepted route, to (dst_rank, dst_row) — no GET at all, so no
//                      expert rank reads a source's rows (no destination-initiated reads in dispatch);
//   combine forward    only GETs, one per accepted route, from (dst_rank, dst_row);
//   combine backward   only PUTs, one per accepted route, to (dst_rank, dst_row);
//   dispatch backward  only GETs, one per accepted route, from (dst_rank, dst_row).
// Every operation moves exactly one encoded row of its leg's payload format, and dropped routes move
// nothing. The combine passes use one buffer (the expert-output scratch), the dispatch passes two others
// (the leased payload, the leased input gradient).
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "moe/counting_heap.hpp"

namespace expar {
namespace {

constexpr int kRanks = 3, kExperts = 6, kTopK = 2;
constexpr int64_t kD = 64, kH = 16;
constexpr uint64_t kSeed = 80808;

struct Case {
  const char* name;
  PayloadPrecision precision;
  bool capacity;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.name) + (info.param.capacity ? "_capacity" : "_dropless");
}

// The operations a pass must issue: one per accepted route, at its (dst_rank, dst_row), one encoded row.
std::vector<testing::OneSidedOp> expected_ops(const RouteMap& map, PayloadFormat format, int64_t d) {
  const size_t rb = payload_row_bytes(format, d);
  std::vector<testing::OneSidedOp> ops;
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k)
      if (map.valid(t, k))
        ops.push_back({map.rank_of(t, k), -1, static_cast<size_t>(map.row_of(t, k)) * rb, rb});
  std::sort(ops.begin(), ops.end());
  return ops;
}

// `ops` with their common buffer checked and masked (-1), sorted; `buffer` receives it.
std::vector<testing::OneSidedOp> masked(std::vector<testing::OneSidedOp> ops, BufferId& buffer) {
  buffer = ops.empty() ? -1 : ops.front().buffer;
  for (auto& op : ops) {
    EXPECT_EQ(op.buffer, buffer) << "one pass targets one buffer";
    op.buffer = -1;
  }
  std::sort(ops.begin(), ops.end());
  return ops;
}

class RowwiseTransferDirectionsTest : public ::testing::TestWithParam<Case> {};

TEST_P(RowwiseTransferDirectionsTest, DispatchPutsCombineGetsAndBackwardReverses) {
  const Case c = GetParam();
  int64_t routes_moved = 0, routes_dropped = 0;
  std::mutex mutex;
  run_ranks(kRanks, [&](Comm& world) {
    MoeConfig cfg;
    cfg.router.num_experts = kExperts;
    cfg.router.top_k = kTopK;
    cfg.model_dim = kD;
    cfg.hidden_dim = kH;
    MoeExecution run;
    run.path = "rowwise";
    run.precision = c.precision;
    if (c.capacity) run.capacity = CapacityPolicy::with(CapacityRule::Source, 0.5);
    testing::CountingHeap heap(world.make_heap());
    MoeLayer layer(cfg, run, world, "moe", MoeSharedResources{&heap, nullptr, 0});
    layer.init_params(kSeed);
    const int64_t t_count = 9 + 4 * world.rank();
    Tensor x = Tensor::empty({t_count, kD});
    Tensor grad_y = Tensor::empty({t_count, kD});
    fill_normal(x, kSeed, 1 + static_cast<uint64_t>(world.rank()), 1.0f);
    fill_normal(grad_y, kSeed, 11 + static_cast<uint64_t>(world.rank()), 1.0f);
    RouterState rs;
    const RouterOutput routed = router_forward(cfg.router, x, layer.params().w_router, nullptr, rs);
    const RouteMap map = build_route_map(routed.topk_idx, world, layer.placement(), run.capacity);
    ExpertPath& path = layer.path();
    PathState ps;
    ExpertMlpState es;
    heap.take();

    Tensor in = path.dispatch_forward(x, map, ps);
    const testing::OneSidedLog dispatch_fwd = heap.take();
    Tensor out = path.expert_output_buffer(map, kD, ps);
    expert_mlp_forward(in, run.precision.dispatch, map.expert_offsets, layer.params().experts, out, &es);
    path.combine_forward(out, routed.topk_weight, map, ps);
    const testing::OneSidedLog combine_fwd = heap.take();
    Tensor grad_w;
    Tensor grad_out = path.combine_backward(grad_y, routed.topk_weight, map, ps, grad_w);
    const testing::OneSidedLog combine_bwd = heap.take();
    Tensor grad_in = path.expert_grad_input_buffer(map, kD, ps);
    expert_mlp_backward(grad_out, es, layer.params().experts, grad_in, layer.grads().experts);
    path.dispatch_backward(grad_in, map, ps);
    const testing::OneSidedLog dispatch_bwd = heap.take();

    EXPECT_TRUE(dispatch_fwd.gets.empty()) << "dispatch forward reads no remote row (Table 8: PUT)";
    EXPECT_TRUE(combine_fwd.puts.empty()) << "combine forward writes no remote row (Table 8: GET)";
    EXPECT_TRUE(combine_bwd.gets.empty()) << "combine backward reads no remote row (Table 8: PUT)";
    EXPECT_TRUE(dispatch_bwd.puts.empty()) << "dispatch backward writes no remote row (Table 8: GET)";
    BufferId df = -1, cf = -1, cb = -1, db = -1;
    EXPECT_EQ(masked(dispatch_fwd.puts, df), expected_ops(map, c.precision.dispatch, kD));
    EXPECT_EQ(masked(combine_fwd.gets, cf), expected_ops(map, c.precision.combine, kD));
    EXPECT_EQ(masked(combine_bwd.puts, cb), expected_ops(map, c.precision.combine_grad, kD));
    EXPECT_EQ(masked(dispatch_bwd.gets, db), expected_ops(map, c.precision.dispatch_grad, kD));
    const int64_t accepted = map.tokens * map.top_k - map.dropped;
    if (accepted > 0) {
      EXPECT_EQ(cf, cb) << "combine forward and backward share the expert-output scratch slot";
      EXPECT_NE(df, cf);
      EXPECT_NE(df, db) << "the input gradient does not overwrite the leased dispatch payload";
      EXPECT_NE(cf, db);
    }
    std::lock_guard lock(mutex);
    routes_moved += accepted;
    routes_dropped += map.dropped;
  });
  EXPECT_GT(routes_moved, 0);
  if (c.capacity) {
    EXPECT_GT(routes_dropped, 0) << "the capacity case must drop routes (they move nothing)";
  } else {
    EXPECT_EQ(routes_dropped, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, RowwiseTransferDirectionsTest,
                         ::testing::Values(Case{"f32", {}, false}, Case{"f32", {}, true},
                                           Case{"mixed",
                                                {PayloadFormat::MXFP8, PayloadFormat::BF16,
                                                 PayloadFormat::F32, PayloadFormat::MXFP8Floor},
                                                false},
                                           Case{"mixed",
                                                {PayloadFormat::MXFP8, PayloadFormat::BF16,
                                                 PayloadFormat::F32, PayloadFormat::MXFP8Floor},
                                                true}),
                         case_name);

}  // namespace
}  // namespace expar
