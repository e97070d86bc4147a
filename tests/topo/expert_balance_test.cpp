// Redundant experts placed by load (DeepSeek's EPLB policy): hand-worked placements, the replication rule,
// node-first packing, determinism and refusals whose suggested fixes are themselves accepted.
#include "expar/topo/expert_balance.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "expar/core/error.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;

struct Slot {
  int expert, replica, rank;
};

std::vector<Slot> slots_of(const ExpertBalance& b) {
  std::vector<Slot> out;
  for (const PhysicalSlot& s : b.slots) out.push_back({s.expert, s.replica, s.rank});
  return out;
}

void expect_slots(const ExpertBalance& b, const std::vector<Slot>& want) {
  ASSERT_EQ(b.slots.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(b.slots[i].expert, want[i].expert) << "slot " << i;
    EXPECT_EQ(b.slots[i].replica, want[i].replica) << "slot " << i;
    EXPECT_EQ(b.slots[i].rank, want[i].rank) << "slot " << i;
  }
}

std::vector<int> counts_of(const ExpertBalance& b) {
  std::vector<int> out;
  for (int e = 0; e < b.num_experts; ++e) out.push_back(b.replica_count(e));
  return out;
}

std::string refusal(const ExpertBalanceInput& in) {
  try {
    balance_experts(in);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(ExpertBalance, FourExpertsTwoRanksTwoRedundant) {
  // Loads {8,1,1,2}, M = 2, R = 2: S = 6 slots, 3 per rank.
  // Replicate: per-replica loads 8,1,1,2 -> expert 0 (8/2 = 4); 4,1,1,2 -> expert 0 again (8/3 = 2.67).
  // Slots by load: 0a 0b 0c (2.67 each), 3 (2), 1 (1), 2 (1). Pack, least-loaded rank with room:
  //   0a -> rank 0 (tie, lower rank); 0b -> rank 1 (rank 0 holds expert 0); 0c -> both hold 0: rank 0
  //   (tie at 2.67); 3 -> rank 1 (2.67 < 5.33); 1 -> rank 1 (4.67 < 5.33), now full; 2 -> rank 0.
  // Rank 0: {0a, 0c, 2} = 19/3; rank 1: {0b, 1, 3} = 17/3; mean 6 -> imbalance (19/3 - 6)/6 = 1/18.
  // Contiguous {0,1} {2,3}: 9 and 3 -> (9 - 6)/6 = 0.5.
  const ExpertBalance b = balance_experts({{8, 1, 1, 2}, 2, 2});
  EXPECT_EQ(b.num_slots, 6);
  EXPECT_EQ(b.slots_per_rank, 3);
  EXPECT_EQ(counts_of(b), (std::vector<int>{3, 1, 1, 1}));
  expect_slots(b, {{0, 0, 0}, {0, 2, 0}, {2, 0, 0}, {0, 1, 1}, {1, 0, 1}, {3, 0, 1}});
  EXPECT_EQ(b.replicas[0], (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(b.replicas[3], (std::vector<int>{5}));
  EXPECT_DOUBLE_EQ(b.slots[0].load, 8.0 / 3);
  EXPECT_DOUBLE_EQ(b.rank_load[0], 8.0 / 3 + 8.0 / 3 + 1);
  EXPECT_DOUBLE_EQ(b.rank_load[1], 8.0 / 3 + 1 + 2);
  EXPECT_NEAR(b.imbalance, 1.0 / 18, 1e-12);
  ASSERT_TRUE(b.contiguous_imbalance.has_value());
  EXPECT_DOUBLE_EQ(*b.contiguous_imbalance, 0.5);
  EXPECT_EQ(*b.contiguous_rank_load, (std::vector<double>{9, 3}));
  EXPECT_FALSE(b.node_first);
  EXPECT_EQ(b.rank_slots(1), (std::vector<int>{3, 4, 5}));
}

TEST(ExpertBalance, ReplicationTiesGoToTheLowerExpertAndPackingEvensOut) {
  // Loads {6,3,2,1}, M = 2, R = 4: S = 8, 4 per rank. Replicate (load per replica, pick):
  //   6 3 2 1 -> 0 (now 3); 3 3 2 1 -> tie, 0 (now 2); 2 3 2 1 -> 1 (now 1.5); 2 1.5 2 1 -> tie, 0 (1.5).
  // Counts {4,2,1,1}. Slots by load: 2 (2), 0a-0d (1.5), 1a 1b (1.5), 3 (1). Pack:
  //   2 -> r0 (2); 0a -> r1 (1.5); 0b -> r0, the one without expert 0 (3.5); 0c -> both hold 0, r1 (3);
  //   0d -> r1 (4.5, 3 slots); 1a -> r0 (3.5 < 4.5: 5, 3 slots); 1b -> r1, without expert 1 (6, full);
  //   3 -> r0 (6). Both ranks 6: imbalance 0. Contiguous {0,1} {2,3}: 9 and 3 -> 0.5.
  const ExpertBalance b = balance_experts({{6, 3, 2, 1}, 4, 2});
  EXPECT_EQ(counts_of(b), (std::vector<int>{4, 2, 1, 1}));
  expect_slots(b, {{0, 1, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {0, 0, 1}, {0, 2, 1}, {0, 3, 1}, {1, 1, 1}});
  EXPECT_EQ(b.rank_load, (std::vector<double>{6, 6}));
  EXPECT_EQ(b.imbalance, 0);
  EXPECT_DOUBLE_EQ(*b.contiguous_imbalance, 0.5);
}

TEST(ExpertBalance, ReplicasOfOneExpertGoToDifferentRanksWhilePossible) {
  // One hot expert and three idle ones over 4 ranks with 4 redundant slots: the hot expert gets all five
  // replicas... but only four ranks, so exactly one rank holds two of them; every rank holds at least one.
  const ExpertBalance b = balance_experts({{100, 0, 0, 0}, 4, 4});
  EXPECT_EQ(counts_of(b), (std::vector<int>{5, 1, 1, 1}));
  std::vector<int> per_rank(4, 0);
  for (int slot : b.replicas[0]) ++per_rank[static_cast<size_t>(b.slots[static_cast<size_t>(slot)].rank)];
  std::sort(per_rank.begin(), per_rank.end());
  EXPECT_EQ(per_rank, (std::vector<int>{1, 1, 1, 2}));
  EXPECT_DOUBLE_EQ(b.imbalance, (40.0 - 25.0) / 25.0);  // the rank with two replicas holds 2 x 20
  EXPECT_DOUBLE_EQ(*b.contiguous_imbalance, 3.0);       // 100 on rank 0, mean 25
}

TEST(ExpertBalance, NodeFirstKeepsGroupsAndReplicasInsideANode) {
  // Loads {1,1,6,4}, M = 4 ranks, K = 2 per node (2 nodes), G = 2 groups {0,1} {2,3}, R = 4: S = 8,
  // 2 per rank, 4 per node. Group loads 2 and 10: group 1 -> node 0 (heaviest first), group 0 -> node 1.
  // Node 0, experts {2,3} loads {6,4}, 4 slots: 6 4 -> 2 (now 3); 3 4 -> 3 (now 2). Counts {2,2}.
  //   2a -> r0, 2b -> r1 (3 each, r0 holds 2); 3a -> r0 (tie), 3b -> r1: ranks 0 and 1 at 5.
  // Node 1, experts {0,1} loads {1,1}: 1 1 -> 0 (tie, 0.5); 0.5 1 -> 1. Counts {2,2}.
  //   0a -> r2, 0b -> r3, 1a -> r2 (tie), 1b -> r3: ranks 2 and 3 at 1.
  // Loads {5,5,1,1}, mean 3: imbalance 2/3. The contiguous placement {1,1,6,4}: (6 - 3)/3 = 1.
  const ExpertBalance b = balance_experts({{1, 1, 6, 4}, 4, 4, 2, 2});
  EXPECT_TRUE(b.node_first);
  EXPECT_EQ(b.nodes, 2);
  EXPECT_EQ(counts_of(b), (std::vector<int>{2, 2, 2, 2}));
  expect_slots(b, {{2, 0, 0}, {3, 0, 0}, {2, 1, 1}, {3, 1, 1}, {0, 0, 2}, {1, 0, 2}, {0, 1, 3}, {1, 1, 3}});
  EXPECT_EQ(b.rank_load, (std::vector<double>{5, 5, 1, 1}));
  EXPECT_DOUBLE_EQ(b.imbalance, 2.0 / 3);
  EXPECT_DOUBLE_EQ(*b.contiguous_imbalance, 1.0);

  // The same loads without nodes: replication is global. 1 1 6 4 -> 2 (3); 1 1 3 4 -> 3 (2);
  // 1 1 3 2 -> 2 (2); 1 1 2 2 -> tie, 2 (1.5). Counts {1,1,4,2}. Slots: 3a 3b (2), 2a-2d (1.5), 0 1 (1).
  //   3a -> r0, 3b -> r1, 2a -> r2, 2b -> r3; 2c -> r0 (2 < ... tie with r1, lower: 3.5, full);
  //   2d -> r1 (3.5, full); 0 -> r2 (2.5, full); 1 -> r3 (2.5). Loads {3.5,3.5,2.5,2.5}: imbalance 1/6.
  const ExpertBalance flat = balance_experts({{1, 1, 6, 4}, 4, 4});
  EXPECT_FALSE(flat.node_first);
  EXPECT_EQ(counts_of(flat), (std::vector<int>{1, 1, 4, 2}));
  expect_slots(flat,
               {{2, 2, 0}, {3, 0, 0}, {2, 3, 1}, {3, 1, 1}, {0, 0, 2}, {2, 0, 2}, {1, 0, 3}, {2, 1, 3}});
  EXPECT_DOUBLE_EQ(flat.imbalance, 0.5 / 3);
}

TEST(ExpertBalance, NodeFirstWithOneGroupPerExpertByDefault) {
  // G defaults to E: experts are packed onto nodes one by one (6 -> n0, 4 -> n1, 1 -> n1, 1 -> n0 once n1
  // is full), so node 0 holds {1,2} and node 1 {0,3}; every replica stays in its expert's node.
  const ExpertBalance b = balance_experts({{1, 1, 6, 4}, 4, 4, 2});
  EXPECT_TRUE(b.node_first);
  EXPECT_EQ(b.expert_groups, 4);
  for (int e = 0; e < 4; ++e) {
    std::vector<int> nodes;
    for (int slot : b.replicas[static_cast<size_t>(e)])
      nodes.push_back(b.slots[static_cast<size_t>(slot)].rank / 2);
    EXPECT_EQ(std::count(nodes.begin(), nodes.end(), nodes.front()), static_cast<long>(nodes.size())) << e;
    EXPECT_EQ(nodes.front(), e == 1 || e == 2 ? 0 : 1) << e;
  }
  // Node 0 (experts 1 and 2, loads 1 and 6) has 4 slots, 2 extra: 6 -> 3 -> 2 per replica, both to
  // expert 2 (counts 1 and 3); node 1 (experts 0 and 3, loads 1 and 4): 4 -> 2 -> 1.33, both to expert 3.
  EXPECT_EQ(counts_of(b), (std::vector<int>{1, 1, 3, 3}));
}

TEST(ExpertBalance, GroupsThatDoNotDivideOverTheNodesFallBackToTheGlobalPolicy) {
  const std::vector<double> loads{5, 1, 2, 7, 3, 4};
  // E = 6 in G = 3 groups over 2 nodes (M = 4, K = 2): 3 % 2 != 0, so the global policy, as without nodes.
  const ExpertBalance b = balance_experts({loads, 2, 4, 2, 3});
  EXPECT_FALSE(b.node_first);
  EXPECT_EQ(b.nodes, 2);
  EXPECT_THAT(b.policy_note, HasSubstr("G=3 expert groups do not divide over the 2 nodes"));
  const ExpertBalance flat = balance_experts({loads, 2, 4});
  EXPECT_EQ(slots_of(b).size(), slots_of(flat).size());
  for (size_t i = 0; i < b.slots.size(); ++i) {
    EXPECT_EQ(b.slots[i].expert, flat.slots[i].expert);
    EXPECT_EQ(b.slots[i].rank, flat.slots[i].rank);
  }
  // M = 4 does not divide E = 6: no contiguous figure, and the reason says so.
  EXPECT_FALSE(b.contiguous_imbalance.has_value());
  EXPECT_THAT(b.contiguous_note, HasSubstr("E=6 experts do not divide over M=4 ranks"));
  // A group inside one node (M <= K) is one node: the global policy, with no note.
  const ExpertBalance one_node = balance_experts({loads, 2, 4, 8});
  EXPECT_EQ(one_node.nodes, 1);
  EXPECT_TRUE(one_node.policy_note.empty());
}

// A deterministic pseudo-random load vector (64-bit LCG), to check the invariants beyond hand-worked cases.
std::vector<double> pseudo_random_loads(int n, uint64_t seed) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    out.push_back(static_cast<double>((seed >> 33) % 1000));
  }
  return out;
}

TEST(ExpertBalance, InvariantsAndDeterminismOverManyLoads) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const int e_count = 16 * static_cast<int>(1 + seed % 4);  // 16..64
    const int m = 8, k = seed % 2 == 0 ? 4 : 0;
    const int r = 8 * static_cast<int>(seed % 3);
    const std::vector<double> loads = pseudo_random_loads(e_count, seed);
    const ExpertBalanceInput in{loads, r, m, k};
    const ExpertBalance b = balance_experts(in);
    const ExpertBalance again = balance_experts(in);
    ASSERT_EQ(b.slots.size(), again.slots.size());
    for (size_t i = 0; i < b.slots.size(); ++i) {
      EXPECT_EQ(b.slots[i].expert, again.slots[i].expert);
      EXPECT_EQ(b.slots[i].replica, again.slots[i].replica);
      EXPECT_EQ(b.slots[i].rank, again.slots[i].rank);
    }
    EXPECT_EQ(b.rank_load, again.rank_load);
    // Every rank holds S/M slots, slot s on rank s / (S/M); loads are conserved.
    ASSERT_EQ(static_cast<int>(b.slots.size()), e_count + r);
    for (int s = 0; s < e_count + r; ++s)
      EXPECT_EQ(b.slots[static_cast<size_t>(s)].rank, s / ((e_count + r) / m));
    const double total = std::accumulate(loads.begin(), loads.end(), 0.0);
    EXPECT_NEAR(std::accumulate(b.rank_load.begin(), b.rank_load.end(), 0.0), total, 1e-9 * total);
    // Replica indices run 0..c-1 per expert; counts follow the rule without nodes: no expert could give up a
    // replica to one whose load per replica would still be higher (max L/c <= min L/(c-1) over c > 1).
    double most = 0, least_with_extra = INFINITY;
    for (int e = 0; e < e_count; ++e) {
      const int c = b.replica_count(e);
      ASSERT_GE(c, 1);
      for (int i = 0; i < c; ++i)
        EXPECT_EQ(
            b.slots[static_cast<size_t>(b.replicas[static_cast<size_t>(e)][static_cast<size_t>(i)])].expert,
            e);
      const double l = loads[static_cast<size_t>(e)];
      most = std::max(most, l / c);
      if (c > 1) least_with_extra = std::min(least_with_extra, l / (c - 1));
    }
    if (k == 0) {
      EXPECT_LE(most, least_with_extra) << seed;
    }
    // Replicas never share a rank while the expert has no more replicas than ranks.
    for (int e = 0; e < e_count; ++e) {
      std::vector<int> ranks;
      for (int s : b.replicas[static_cast<size_t>(e)]) ranks.push_back(b.slots[static_cast<size_t>(s)].rank);
      std::sort(ranks.begin(), ranks.end());
      const int span = k == 0 ? m : k;
      if (static_cast<int>(ranks.size()) <= span) {
        EXPECT_EQ(std::adjacent_find(ranks.begin(), ranks.end()), ranks.end())
            << "seed " << seed << " expert " << e;
      }
    }
    // With replicas the flat policy never balances worse than the contiguous placement here.
    if (k == 0 && r > 0) {
      EXPECT_LE(b.imbalance, *b.contiguous_imbalance) << seed;
    }
  }
}

TEST(ExpertBalance, ZipfLoadAtEp4WithASixteenthOfSlotsRedundant) {
  // Load of expert e proportional to 1/(e+1) (Zipf, s = 1), E = 64, M = 4, R = 16 (issue #36's benchmark
  // shape): contiguous placement puts the head of the distribution on rank 0.
  std::vector<double> loads;
  for (int e = 0; e < 64; ++e) loads.push_back(1e6 / (e + 1));
  const ExpertBalance b = balance_experts({loads, 16, 4});
  EXPECT_GT(*b.contiguous_imbalance, 1.0);
  EXPECT_LT(b.imbalance, 0.01);
  EXPECT_EQ(b.replica_count(0), 8);
  // Equal loads: exactly 0, never a rounding error's -0.000 (0.1 + 0.1 + 0.1 = 0.30000000000000004 > 3 x
  // 0.1).
  EXPECT_EQ(load_imbalance({0.1, 0.1, 0.1}), 0.0);
  EXPECT_EQ(load_imbalance({0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(load_imbalance({3, 1}),
                   0.5);  // 1e6/8 = 125000 per replica: the head takes half the extra slots
}

// Per layer over the ranks, by hand: [rank][layer] rows {4, 0, 3}, {2, 0, 1} and {0} (a rank that lists only
// layer 0). Layer 0: mean 2, max 4 -> 1; layer 1 has no rows (dense) -> 0, left out of the mean; layer 2:
// mean 4/3, max 3 -> 1.25. Mean over the layers with rows (1 + 1.25) / 2.
TEST(ExpertBalance, LayerImbalanceOverRanksPerLayer) {
  const LayerImbalance got = layer_imbalance({{4, 0, 3}, {2, 0, 1}, {0}});
  ASSERT_EQ(got.per_layer.size(), 3u);
  EXPECT_DOUBLE_EQ(got.per_layer[0], 1.0);
  EXPECT_EQ(got.per_layer[1], 0.0);
  EXPECT_DOUBLE_EQ(got.per_layer[2], 1.25);
  EXPECT_DOUBLE_EQ(got.mean, 1.125);
  EXPECT_DOUBLE_EQ(got.largest, 1.25);
  const LayerImbalance none = layer_imbalance({});
  EXPECT_TRUE(none.per_layer.empty());
  EXPECT_EQ(none.mean, 0.0);
}

TEST(ExpertBalance, RefusalsNameTheValueTheRuleAndAnAcceptedFix) {
  EXPECT_THAT(refusal({{}, 0, 1}), HasSubstr("no expert loads given"));
  EXPECT_THAT(refusal({{1, -2}, 0, 1}), HasSubstr("the load of expert 1 is -2"));
  EXPECT_THAT(refusal({{1, NAN}, 0, 1}), HasSubstr("the load of expert 1 is nan"));
  EXPECT_THAT(refusal({{1e308, 1e308}, 0, 1}), HasSubstr("the 2 expert loads add up to inf"));
  EXPECT_THAT(refusal({{1, 2}, -1, 1}), HasSubstr("redundant experts R=-1 is negative"));
  EXPECT_THAT(refusal({{1, 2}, 0, 0}), HasSubstr("EP group size M=0"));

  // S = 62 + 3 = 65 over M = 4: the suggested R values (2, 6, 10: 62 + R divisible by 4) are accepted.
  const std::string slots = refusal({std::vector<double>(62, 1.0), 3, 4});
  EXPECT_THAT(slots, HasSubstr("S = E + R = 62 + 3 = 65 physical expert slots are not divisible by the EP "
                               "group size M=4"));
  EXPECT_THAT(slots, HasSubstr("--redundant-experts) in {2, 6, 10, ...}"));
  for (int r : {2, 6, 10}) EXPECT_EQ(balance_experts({std::vector<double>(62, 1.0), r, 4}).num_slots, 62 + r);

  const std::vector<double> loads(64, 1.0);
  // M = 12 over nodes of K = 8 ranks: the suggested K (divisors of 12) are accepted.
  const std::string nodes = refusal({loads, 8, 12, 8});
  EXPECT_THAT(nodes, HasSubstr("the EP group of M=12 ranks neither fits in one node of K=8 ranks"));
  EXPECT_THAT(nodes, HasSubstr("in {1,2,3,4,6,12} or K >= 12"));
  for (int k : {1, 2, 3, 4, 6, 12, 16}) EXPECT_NO_THROW(balance_experts({loads, 8, 12, k})) << k;

  // G = 5 does not divide E = 64: the suggested G (divisors of 64) are accepted.
  const std::string groups = refusal({loads, 0, 4, 2, 5});
  EXPECT_THAT(groups, HasSubstr("E=64 experts do not split into G=5 equal groups"));
  EXPECT_THAT(groups, HasSubstr("{1,2,4,8,16,32,64}"));
  for (int g : {1, 2, 4, 8, 16, 32, 64}) EXPECT_NO_THROW(balance_experts({loads, 0, 4, 2, g})) << g;
}

}  // namespace
}  // namespace expar
