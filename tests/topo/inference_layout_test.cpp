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

TEST(InferenceLayout, DataParallelRequiresEpOverAllRanks) {
  const auto msg = error_of(config(4, 2, true, 4, 32));
  EXPECT_THAT(msg, HasSubstr("ep_degree=4 with data_parallel_size=2"));
  EXPECT_THAT(msg, HasSubstr("must equal TP*DP=4*2=8"));
  EXPECT_THAT(msg, HasSubstr("set ep_degree=8, or set data_parallel_size=1"));
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
