// Messages across emulated nodes (LaunchOptions::ranks_per_node) per execution path, read from the EP group's
// Comm::stats().traffic and its heap's SymmetricHeap::stats(): the rowwise path sends one message per route
// row that crosses a node (seed 000 §5.8: the NIC message-rate problem), the block path one per peer and
// exchange, whatever the number of rows, and the aggregated path one per (source rank, other node) and leg
// (with waves: and wave).
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/waves.hpp"
#include "moe/counting_heap.hpp"

namespace expar {
namespace {

constexpr int kRanks = 4, kPerNode = 2, kExperts = 8, kTopK = 2;
constexpr int64_t kD = 16;
constexpr int64_t kRowBytes = kD * static_cast<int64_t>(sizeof(float));

struct Traffic {
  TrafficStats collective, one_sided;
  int64_t rows_across = 0;  // accepted routes of this rank whose expert is on another node
  int64_t peers_across_with_rows = 0;
  int64_t nodes_across_with_rows = 0;  // other nodes that some accepted route of this rank goes to
  int64_t rows_within = 0;             // accepted routes of this rank whose expert is on its own node
  // (other node, wave) pairs that some accepted route of this rank goes to: a wave's local experts on that
  // node's ranks (Launch::waves; with one wave, nodes_across_with_rows).
  int64_t node_waves_across_with_rows = 0;
  // As the aggregated path's proxy on its node (the member with the source's index on its node): the runs
  // of rows it forwards, one per (source on another node, local expert of a member of this node) with rows.
  int64_t proxy_runs = 0;
  testing::OneSidedLog log;  // with `counted`: every put and get, none through a mapped pointer
};

struct Launch {
  int ranks = kRanks, per_node = kPerNode;
  bool counted = false;  // the heap maps no peer (testing::CountingHeap): every row is a logged put or get
  int waves = 1;         // MoeConfig::waves (wave-sequential)
};

// One training step of `path` with `tokens` tokens per rank; every rank's traffic, index = world rank.
std::vector<Traffic> step_traffic(const std::string& path, int64_t tokens, Launch how = {}) {
  std::vector<Traffic> out(static_cast<size_t>(how.ranks));
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = how.ranks;
  launch.ranks_per_node = how.per_node;
  launch.timeout_seconds = 120;
  run_ranks(launch, [&](Comm& world) {
    MoeConfig cfg;
    cfg.router.num_experts = kExperts;
    cfg.router.top_k = kTopK;
    cfg.model_dim = kD;
    cfg.hidden_dim = 8;
    MoeExecution run;
    run.path = path;
    run.waves = {how.waves, false};
    std::unique_ptr<SymmetricHeap> heap = world.make_heap();
    testing::CountingHeap* counting = nullptr;
    if (how.counted) {
      auto wrapped = std::make_unique<testing::CountingHeap>(std::move(heap));
      counting = wrapped.get();
      heap = std::move(wrapped);
    }
    MoeLayer layer(cfg, run, world, "moe", MoeSharedResources{heap.get(), nullptr, -1});
    layer.init_params(7);
    Tensor x = Tensor::empty({tokens, kD}), grad_y = Tensor::empty({tokens, kD});
    fill_normal(x, 11, static_cast<uint64_t>(world.rank()), 1.0f);
    fill_normal(grad_y, 12, static_cast<uint64_t>(world.rank()), 1.0f);
    world.reset_stats();
    heap->reset_stats();
    if (counting != nullptr) counting->take();
    MoeState state;
    layer.forward(x, state);
    layer.backward(grad_y, state);
    Traffic t;
    t.collective = world.stats().traffic;
    t.one_sided = heap->stats().puts;
    t.one_sided += heap->stats().gets;
    if (counting != nullptr) t.log = counting->take();
    const NodeMap& nodes = world.nodes();
    const int me = world.rank();
    const RouteMap& map = state.routes;
    for (int64_t i = 0; i < tokens; ++i)
      for (int k = 0; k < kTopK; ++k)
        if (map.valid(i, k)) ++(nodes.across(me, map.rank_of(i, k)) ? t.rows_across : t.rows_within);
    for (int r = 0; r < how.ranks; ++r)
      if (nodes.across(me, r) && map.send_counts[static_cast<size_t>(r)] > 0) ++t.peers_across_with_rows;
    const ExpertPlacement placement(kExperts, how.ranks);
    for (int n = 0; n < nodes.num_nodes; ++n) {
      int64_t rows = 0;
      for (int r = n * how.per_node; r < (n + 1) * how.per_node; ++r)
        rows += map.send_counts[static_cast<size_t>(r)];
      if (n != nodes.node_of[static_cast<size_t>(me)] && rows > 0) ++t.nodes_across_with_rows;
    }
    const std::vector<ExpertWave> waves = split_expert_waves(placement.local_count(), how.waves);
    for (int n = 0; n < nodes.num_nodes; ++n) {
      if (n == nodes.node_of[static_cast<size_t>(me)]) continue;
      for (const ExpertWave& w : waves) {
        int64_t rows = 0;
        for (int r = n * how.per_node; r < (n + 1) * how.per_node; ++r)
          for (int l = w.begin; l < w.end; ++l) rows += map.accepted_of(me, placement.global_expert(r, l));
        if (rows > 0) ++t.node_waves_across_with_rows;
      }
    }
    for (int s = 0; s < how.ranks; ++s) {
      if (!nodes.across(me, s) || s % how.per_node != me % how.per_node) continue;
      const int first = nodes.node_of[static_cast<size_t>(me)] * how.per_node;
      for (int r = first; r < first + how.per_node; ++r)
        for (int e : placement.local_experts(r)) t.proxy_runs += map.accepted_of(s, e) > 0 ? 1 : 0;
    }
    std::lock_guard lock(mutex);
    out[static_cast<size_t>(me)] = t;
  });
  return out;
}

TEST(NodeTraffic, RowwiseSendsOneMessageAcrossNodesPerRouteRowAndLeg) {
  for (int64_t tokens : {16, 48}) {
    const auto traffic = step_traffic("rowwise", tokens);
    for (int r = 0; r < kRanks; ++r) {
      SCOPED_TRACE(fmt::format("rank {}, {} tokens", r, tokens));
      const Traffic& t = traffic[static_cast<size_t>(r)];
      ASSERT_GT(t.rows_across, 0);
      // Four legs (dispatch put, combine get, combine-backward put, dispatch-backward get), one row each.
      EXPECT_EQ(t.one_sided.inter_node_messages, 4 * t.rows_across);
      EXPECT_EQ(t.one_sided.inter_node_bytes, 4 * t.rows_across * kRowBytes);
      // Peers on my node are mapped: their rows are loads and stores, not messages.
      EXPECT_EQ(t.one_sided.intra_node_messages, 0);
    }
  }
}

TEST(NodeTraffic, BlockSendsAFixedNumberOfMessagesAcrossNodesWhateverTheRows) {
  const auto few = step_traffic("block", 16);
  const auto many = step_traffic("block", 48);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const Traffic& a = few[static_cast<size_t>(r)];
    const Traffic& b = many[static_cast<size_t>(r)];
    EXPECT_EQ(a.one_sided.inter_node_messages + a.one_sided.intra_node_messages, 0) << "block is collectives";
    ASSERT_EQ(a.peers_across_with_rows, kRanks - kPerNode) << "the inputs reach every peer";
    ASSERT_EQ(b.peers_across_with_rows, kRanks - kPerNode);
    EXPECT_EQ(a.collective.inter_node_messages, b.collective.inter_node_messages);
    EXPECT_LT(a.collective.inter_node_bytes, b.collective.inter_node_bytes);
    // At least the four row exchanges reach each peer on the other node.
    EXPECT_GE(a.collective.inter_node_messages, 4 * a.peers_across_with_rows);
    EXPECT_LT(a.collective.inter_node_messages, 4 * a.rows_across) << "fewer messages than rowwise's rows";
  }
}

// The aggregated path: per leg, one message from each source rank to each other node it has rows for (a put
// to, or a get from, that node's proxy), carrying all those rows; nothing else crosses a node. With 2 nodes
// of 2 and of 4 ranks and with 4 nodes of 1, and for 16 and 48 tokens per rank: the count follows the nodes,
// not the rows or the peers.
TEST(NodeTraffic, AggregatedSendsOneMessagePerRankAndOtherNodeAndLeg) {
  for (Launch how : {Launch{4, 2}, Launch{8, 4}, Launch{4, 1}})
    for (int64_t tokens : {16, 48}) {
      const auto traffic = step_traffic("aggregated", tokens, how);
      const auto rowwise = step_traffic("rowwise", tokens, how);
      for (int r = 0; r < how.ranks; ++r) {
        SCOPED_TRACE(
            fmt::format("{} ranks, {} per node: rank {}, {} tokens", how.ranks, how.per_node, r, tokens));
        const Traffic& t = traffic[static_cast<size_t>(r)];
        ASSERT_EQ(t.nodes_across_with_rows, how.ranks / how.per_node - 1) << "the inputs reach every node";
        ASSERT_GT(t.rows_across, t.nodes_across_with_rows) << "more rows than node pairs";
        EXPECT_EQ(t.one_sided.inter_node_messages, 4 * t.nodes_across_with_rows);
        EXPECT_EQ(t.one_sided.inter_node_bytes, 4 * t.rows_across * kRowBytes);
        // Rows inside a node (direct, and forwarded by the proxy) are loads and stores between mapped peers.
        EXPECT_EQ(t.one_sided.intra_node_messages, 0);
        // No collective beyond rowwise's (the route map's count exchange): no split list travels.
        const Traffic& w = rowwise[static_cast<size_t>(r)];
        EXPECT_EQ(t.collective.inter_node_messages, w.collective.inter_node_messages);
        EXPECT_EQ(t.collective.inter_node_bytes, w.collective.inter_node_bytes);
        EXPECT_EQ(t.collective.intra_node_messages, w.collective.intra_node_messages);
      }
    }
}

// With waves, each wave moves its own blocks: per leg one message from each source rank to each other node
// it has rows of that wave for, the same bytes as without waves (2 nodes of 2, 4 nodes of 1; 2 waves of the
// 2 local experts).
TEST(NodeTraffic, AggregatedWavesSendOneMessagePerRankOtherNodeWaveAndLeg) {
  for (Launch how : {Launch{4, 2, false, 2}, Launch{4, 1, false, 2}}) {
    const auto traffic = step_traffic("aggregated", 48, how);
    for (int r = 0; r < how.ranks; ++r) {
      SCOPED_TRACE(
          fmt::format("{} ranks, {} per node, {} waves: rank {}", how.ranks, how.per_node, how.waves, r));
      const Traffic& t = traffic[static_cast<size_t>(r)];
      ASSERT_GT(t.node_waves_across_with_rows, t.nodes_across_with_rows) << "both waves reach another node";
      EXPECT_EQ(t.one_sided.inter_node_messages, 4 * t.node_waves_across_with_rows);
      EXPECT_EQ(t.one_sided.inter_node_bytes, 4 * t.rows_across * kRowBytes);
      EXPECT_EQ(t.one_sided.intra_node_messages, 0);
    }
  }
}

// The same path on a heap that maps no peer (every row a logged put or get): across nodes still exactly one
// operation per (rank, other node) and leg, each of all the rows for that node; inside the node one per row
// for the rank's own node (as rowwise) and one per forwarded run on the proxy, per leg.
TEST(NodeTraffic, AggregatedForwardsInsideTheDestinationNode) {
  const Launch how{4, 2, true};
  const auto traffic = step_traffic("aggregated", 48, how);
  for (int r = 0; r < how.ranks; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const Traffic& t = traffic[static_cast<size_t>(r)];
    int64_t across_ops = 0, across_bytes = 0, within_puts = 0, within_gets = 0;
    auto node_of = [&](int rank) { return rank / how.per_node; };
    for (const auto* ops : {&t.log.puts, &t.log.gets})
      for (const testing::OneSidedOp& op : *ops) {
        if (node_of(op.peer) != node_of(r)) {
          ++across_ops;
          across_bytes += static_cast<int64_t>(op.bytes);
        } else {
          ++(ops == &t.log.puts ? within_puts : within_gets);
        }
      }
    ASSERT_GT(t.proxy_runs, 0);
    EXPECT_EQ(across_ops, 4 * t.nodes_across_with_rows);
    EXPECT_EQ(across_bytes, 4 * t.rows_across * kRowBytes);
    // Dispatch and combine backward put, combine and dispatch backward get.
    EXPECT_EQ(within_puts, 2 * (t.rows_within + t.proxy_runs));
    EXPECT_EQ(within_gets, 2 * (t.rows_within + t.proxy_runs));
  }
}

TEST(NodeTraffic, OneNodeSendsNothingAcrossNodes) {
  LaunchOptions launch;
  launch.ranks = kRanks;
  run_ranks(launch, [&](Comm& world) {
    EXPECT_EQ(world.nodes().num_nodes, 1);
    std::vector<float> v(8, 1.0f);
    world.all_reduce(std::span<float>(v));
    EXPECT_EQ(world.stats().traffic.inter_node_messages, 0);
    EXPECT_EQ(world.stats().traffic.intra_node_messages, kRanks - 1);
    EXPECT_EQ(world.stats().traffic.intra_node_bytes, (kRanks - 1) * 32);
  });
}

}  // namespace
}  // namespace expar
