// Inference layouts and every validation rule of seed 002.
#include "expar/topo/inference_layout.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "expar/core/error.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

std::vector<int> iota(int begin, int end) {
  std::vector<int> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

Groups singletons(int n) {
  Groups g;
  for (int r = 0; r < n; ++r) g.push_back({r});
  return g;
}

InferenceConfig config(int tp, int dp, bool ep, std::optional<int> degree, int experts) {
  InferenceConfig c;
  c.tp = tp;
  c.dp = dp;
  c.enable_expert_parallel = ep;
  c.ep_degree = degree;
  c.num_experts = experts;
  return c;
}

std::string error_of(const InferenceConfig& c) {
  try {
    InferenceLayout layout(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Seed 002 "Full EP": TP=8, EP enabled, no ep_degree -> EP=8, single-rank EP_TP groups, 4 of 32 experts each.
TEST(InferenceLayout, FullEpDefaultsToAllRanks) {
  const InferenceLayout l(config(8, 1, true, std::nullopt, 32));
  EXPECT_EQ(l.ep_degree(), 8);
  EXPECT_EQ(l.ep_tp_size(), 1);
  EXPECT_FALSE(l.variable_ep());
  EXPECT_EQ(l.groups(InferenceGroup::Tp), (Groups{iota(0, 8)}));
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), singletons(8));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), (Groups{iota(0, 8)}));
  const auto info = l.rank_info(1);
  EXPECT_EQ(info.ep_rank, 1);
  EXPECT_EQ(info.local_experts, (std::vector<int>{4, 5, 6, 7}));  // seed 002: EP rank 1 needs experts 4-7
  EXPECT_EQ(l.intermediate_shard(1, 3072), (std::pair<int, int>{0, 3072}));  // full intermediate
  EXPECT_EQ(l.rank_info(7).local_experts, (std::vector<int>{28, 29, 30, 31}));
}

// Seed 002 "Variable EP": TP=8, ep_degree=2.
TEST(InferenceLayout, VariableEpOfSeed002) {
  const InferenceLayout l(config(8, 1, true, 2, 32));
  EXPECT_TRUE(l.variable_ep());
  EXPECT_EQ(l.ep_tp_size(), 4);
  EXPECT_EQ(l.groups(InferenceGroup::Tp), (Groups{iota(0, 8)}));
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(l.rank_info(r).ep_rank, r < 4 ? 0 : 1) << r;
  // "EP rank 0, TP rank 2 (global rank 2) needs experts [0..15], intermediate shard 2/4" of I=3072 (768
  // each).
  const auto info = l.rank_info(2);
  EXPECT_EQ(info.ep_tp_rank, 2);
  EXPECT_EQ(info.ep_tp_size, 4);
  EXPECT_EQ(info.local_experts, iota(0, 16));
  EXPECT_EQ(l.intermediate_shard(2, 3072), (std::pair<int, int>{1536, 2304}));
  EXPECT_EQ(l.rank_info(5).local_experts, iota(16, 32));
}

// Seed 002 "Cross-DP EP": TP=4, DP=2 on 8 ranks; ep_degree = 8, 4 of 32 experts per rank.
TEST(InferenceLayout, CrossDpEpOfSeed002) {
  const InferenceLayout l(config(4, 2, true, std::nullopt, 32));
  EXPECT_TRUE(l.cross_dp_ep());
  EXPECT_EQ(l.ep_degree(), 8);
  EXPECT_EQ(l.groups(InferenceGroup::Tp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::Dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), singletons(8));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), (Groups{iota(0, 8)}));
  const auto info = l.rank_info(6);
  EXPECT_EQ(info.tp_rank, 2);
  EXPECT_EQ(info.dp_rank, 1);
  EXPECT_EQ(info.local_experts, (std::vector<int>{24, 25, 26, 27}));
  // An explicit ep_degree equal to TP*DP is accepted too.
  EXPECT_EQ(InferenceLayout(config(4, 2, true, 8, 32)).ep_degree(), 8);
}

// Seed 002 "No EP (TP=8)": ep_tp_group is the full TP group, every rank holds all experts with I/8.
TEST(InferenceLayout, NoEpShardsTheIntermediateOverTp) {
  const InferenceLayout l(config(8, 1, false, std::nullopt, 32));
  EXPECT_FALSE(l.expert_parallel());
  EXPECT_EQ(l.ep_degree(), 1);
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), (Groups{iota(0, 8)}));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), singletons(8));
  EXPECT_EQ(l.rank_info(3).local_experts, iota(0, 32));
  EXPECT_EQ(l.intermediate_shard(3, 3072), (std::pair<int, int>{1152, 1536}));  // 3072/8 = 384
  // With DP replicas and no EP, each replica's TP group shards the experts independently.
  const InferenceLayout d(config(2, 2, false, std::nullopt, 4));
  EXPECT_EQ(d.groups(InferenceGroup::EpTp), (Groups{{0, 1}, {2, 3}}));
}

TEST(InferenceLayout, RoundRobinPlacementIsSupported) {
  InferenceConfig c = config(4, 1, true, std::nullopt, 8);
  c.placement = PlacementKind::RoundRobin;
  const InferenceLayout l(c);
  EXPECT_EQ(l.rank_info(1).local_experts, (std::vector<int>{1, 5}));
  EXPECT_EQ(l.placement().global_to_local(1), (std::vector<int>{-1, 0, -1, -1, -1, 1, -1, -1}));
}

TEST(InferenceLayout, EpDegreeRequiresEnableExpertParallel) {
  const auto msg = error_of(config(8, 1, false, 2, 32));
  EXPECT_THAT(msg, HasSubstr("ep_degree=2 requires expert parallelism: pass --enable-expert-parallel"));
  EXPECT_THAT(msg, HasSubstr("or drop --ep (ep_degree=1: no expert parallelism)"));
}

// Partial cross-DP EP (lifting seed 002's limitation 2): TP=2, DP=4, ep_degree=4 = 2*TP gives EP groups of 2
// consecutive replicas, {0..3} and {4..7}, each holding one copy of the 16 experts (4 per rank) and
// exchanging tokens between its own 2 replicas only.
TEST(InferenceLayout, PartialCrossDpEpGroupsConsecutiveReplicas) {
  const InferenceLayout l(config(2, 4, true, 4, 16));
  EXPECT_TRUE(l.cross_dp_ep());
  EXPECT_FALSE(l.variable_ep());
  EXPECT_EQ(l.ep_dp_size(), 2);
  EXPECT_EQ(l.ep_tp_size(), 1);
  EXPECT_EQ(l.copy_ranks(), 4);
  EXPECT_EQ(l.expert_copies(), 2);
  EXPECT_EQ(l.groups(InferenceGroup::Tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::Dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::EpDp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), singletons(8));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), (Groups{iota(0, 4), iota(4, 8)}));
  // Rank 5 = replica 2, TP position 1: the second copy's partition 1, the same experts as rank 1.
  const auto info = l.rank_info(5);
  EXPECT_EQ(info.tp_rank, 1);
  EXPECT_EQ(info.dp_rank, 2);
  EXPECT_EQ(info.expert_copy, 1);
  EXPECT_EQ(info.ep_rank, 1);
  EXPECT_EQ(info.local_experts, iota(4, 8));
  EXPECT_EQ(l.rank_info(1).local_experts, iota(4, 8));
  EXPECT_EQ(l.rank_info(1).expert_copy, 0);
  EXPECT_EQ(l.rank_info(7).local_experts, iota(12, 16));
  EXPECT_EQ(l.intermediate_shard(5, 96), (std::pair<int, int>{0, 96}));  // whole experts
  // Each copy's ranks hold every expert once, and both copies the same set rank for rank.
  for (int copy = 0; copy < 2; ++copy) {
    std::vector<int> held;
    for (int r = 4 * copy; r < 4 * copy + 4; ++r) {
      const auto mine = l.rank_info(r).local_experts;
      held.insert(held.end(), mine.begin(), mine.end());
      if (copy == 1) {
        EXPECT_EQ(mine, l.rank_info(r - 4).local_experts) << "rank " << r;
      }
    }
    EXPECT_EQ(held, iota(0, 16)) << "copy " << copy;
  }
  // TP=1, DP=4, ep_degree=2: EP groups {0,1}, {2,3}; 8 experts, 4 per rank.
  const InferenceLayout one(config(1, 4, true, 2, 8));
  EXPECT_EQ(one.ep_dp_size(), 2);
  EXPECT_EQ(one.groups(InferenceGroup::Ep), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(one.groups(InferenceGroup::EpDp), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(one.rank_info(3).ep_rank, 1);
  EXPECT_EQ(one.rank_info(3).expert_copy, 1);
  EXPECT_EQ(one.rank_info(3).local_experts, iota(4, 8));
  EXPECT_EQ(one.rank_info(2).local_experts, iota(0, 4));
}

// ep_degree dividing TP with DP > 1: each replica is its own copy with (variable or full) EP inside, and no
// tokens cross replicas. TP=4, DP=2, ep_degree=2: EP_TP {0,1},{2,3},{4,5},{6,7}; EP {0,2},{1,3},{4,6},{5,7}.
TEST(InferenceLayout, EpInsideEachReplicaWithDataParallelism) {
  const InferenceLayout l(config(4, 2, true, 2, 8));
  EXPECT_FALSE(l.cross_dp_ep());
  EXPECT_TRUE(l.variable_ep());
  EXPECT_EQ(l.ep_dp_size(), 1);
  EXPECT_EQ(l.ep_tp_size(), 2);
  EXPECT_EQ(l.expert_copies(), 2);
  EXPECT_EQ(l.groups(InferenceGroup::EpDp), singletons(8));
  EXPECT_EQ(l.groups(InferenceGroup::EpTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(InferenceGroup::Ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  const auto info = l.rank_info(6);
  EXPECT_EQ(info.ep_rank, 1);
  EXPECT_EQ(info.ep_tp_rank, 0);
  EXPECT_EQ(info.expert_copy, 1);
  EXPECT_EQ(info.local_experts, iota(4, 8));
  EXPECT_EQ(l.intermediate_shard(7, 96), (std::pair<int, int>{48, 96}));
  // ep_degree = TP: full EP inside each replica.
  const InferenceLayout full(config(4, 2, true, 4, 8));
  EXPECT_FALSE(full.cross_dp_ep());
  EXPECT_EQ(full.ep_tp_size(), 1);
  EXPECT_EQ(full.groups(InferenceGroup::Ep), (Groups{iota(0, 4), iota(4, 8)}));
  EXPECT_EQ(full.rank_info(5).local_experts, (std::vector<int>{2, 3}));
}

TEST(InferenceLayout, EpGroupsMustHoldWholeReplicas) {
  const auto msg = error_of(config(6, 2, true, 4, 12));
  EXPECT_THAT(msg, HasSubstr("ep_degree=4 with tensor_parallel_size=6 and data_parallel_size=2"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2,3,6,12}"));
  EXPECT_THAT(error_of(config(2, 3, true, 4, 8)), HasSubstr("any multiple of 2"));
}

TEST(InferenceLayout, WorldMustBeDivisibleByEpDegree) {
  const auto msg = error_of(config(8, 1, true, 3, 48));
  EXPECT_THAT(msg, HasSubstr("world_size=8"));
  EXPECT_THAT(msg, HasSubstr("not divisible by ep_degree=3"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2,4,8}"));
  EXPECT_THAT(error_of(config(4, 1, true, 8, 32)), HasSubstr("not divisible by ep_degree=8"));
}

TEST(InferenceLayout, ExpertsMustBeDivisibleByEpDegree) {
  const auto msg = error_of(config(8, 1, true, std::nullopt, 12));
  EXPECT_THAT(msg, HasSubstr("num_experts=12 is not divisible by ep_degree=8"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2,4}"));
}

TEST(InferenceLayout, OtherBadValues) {
  EXPECT_THAT(error_of(config(0, 1, false, std::nullopt, 8)), HasSubstr("tensor_parallel_size=0"));
  EXPECT_THAT(error_of(config(2, 0, false, std::nullopt, 8)), HasSubstr("data_parallel_size=0"));
  EXPECT_THAT(error_of(config(2, 1, true, 0, 8)), HasSubstr("ep_degree=0 must be at least 1"));
  const InferenceLayout l(config(8, 1, true, 2, 32));
  try {
    (void)l.intermediate_shard(0, 3070);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("intermediate size 3070 is not divisible by the 4 ranks"));
  }
  EXPECT_THROW((void)l.rank_info(8), Error);
}

}  // namespace
}  // namespace expar
