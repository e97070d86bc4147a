// Messages across emulated nodes (LaunchOptions::ranks_per_node) per execution path, read from the EP group's
// Comm::stats().traffic and its heap's SymmetricHeap::stats(): the rowwise path sends one message per route
// row that crosses a node (seed 000 §5.8: the NIC message-rate problem), the block path one per peer and
// exchange, whatever the number of rows.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"

namespace expar {
namespace {

constexpr int kRanks = 4, kPerNode = 2, kExperts = 8, kTopK = 2;
constexpr int64_t kD = 16;

struct Traffic {
  TrafficStats collective, one_sided;
  int64_t rows_across = 0;  // accepted routes of this rank whose expert is on another node
  int64_t peers_across_with_rows = 0;
};

// One training step of `path` with `tokens` tokens per rank; every rank's traffic, index = world rank.
std::vector<Traffic> step_traffic(const std::string& path, int64_t tokens) {
  std::vector<Traffic> out(kRanks);
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = kRanks;
  launch.ranks_per_node = kPerNode;
  launch.timeout_seconds = 120;
  run_ranks(launch, [&](Comm& world) {
    MoeConfig cfg;
    cfg.num_experts = kExperts;
    cfg.top_k = kTopK;
    cfg.model_dim = kD;
    cfg.hidden_dim = 8;
    cfg.path = path;
    auto heap = world.make_heap();
    MoeLayer layer(cfg, world, "moe", MoeSharedResources{heap.get(), nullptr, -1});
    layer.init_params(7);
    Tensor x = Tensor::empty({tokens, kD}), grad_y = Tensor::empty({tokens, kD});
    fill_normal(x, 11, static_cast<uint64_t>(world.rank()), 1.0f);
    fill_normal(grad_y, 12, static_cast<uint64_t>(world.rank()), 1.0f);
    world.reset_stats();
    heap->reset_stats();
    MoeState state;
    layer.forward(x, state);
    layer.backward(grad_y, state);
    Traffic t;
    t.collective = world.stats().traffic;
    t.one_sided = heap->stats().puts;
    t.one_sided += heap->stats().gets;
    for (int64_t i = 0; i < tokens; ++i)
      for (int k = 0; k < kTopK; ++k)
        if (state.routes.valid(i, k) && world.nodes().across(world.rank(), state.routes.rank_of(i, k)))
          ++t.rows_across;
    for (int r = 0; r < kRanks; ++r)
      if (world.nodes().across(world.rank(), r) && state.routes.send_counts[static_cast<size_t>(r)] > 0)
        ++t.peers_across_with_rows;
    std::lock_guard lock(mutex);
    out[static_cast<size_t>(world.rank())] = t;
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
      EXPECT_EQ(t.one_sided.inter_node_bytes, 4 * t.rows_across * kD * static_cast<int64_t>(sizeof(float)));
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
