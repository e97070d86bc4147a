// The capacity rules (moe/capacity.hpp) on one hand-built request matrix, worked out by hand from the rules'
// definitions: M = 2 EP ranks, E = 4 experts (contiguous: rank 0 owns experts 0 and 1, rank 1 owns 2 and 3),
// K = 2, T = {3, 1} tokens, cf = 0.5.
//
//   requests    e0 e1 e2 e3        dropless bound (buffer rows): sum_s T_s * min(K, E_L) = 3*2 + 1*2 = 8
//   source 0     3  2  1  0
//   source 1     0  1  1  0
#include "expar/moe/capacity.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "expar/core/error.hpp"

namespace expar {
namespace {

const std::vector<int64_t> kRequests{3, 2, 1, 0, 0, 1, 1, 0};
const std::vector<int64_t> kTokens{3, 1};
constexpr int kTopK = 2;
constexpr double kCf = 0.5;

CapacityPlan plan(CapacityRule rule) {
  const ExpertPlacement placement(4, 2);
  return plan_capacity(
      kRequests, kTokens, kTopK, placement,
      rule == CapacityRule::Dropless ? CapacityPolicy::dropless() : CapacityPolicy::with(rule, kCf));
}

TEST(Capacity, DroplessAcceptsEveryRequest) {
  const CapacityPlan p = plan(CapacityRule::Dropless);
  EXPECT_EQ(p.accepted, kRequests);
  EXPECT_EQ(p.capacity_rows, 8);
}

// Source rule: B_s = ceil(cf*T_s*K/M) rows per destination: B_0 = ceil(1.5) = 2, B_1 = ceil(0.5) = 1,
// granted to the destination's experts in local-expert-major order. Source 0 into rank 0: e0 takes both,
// e1 none; into rank 1: e2 takes 1. Source 1 into rank 0: e1 takes 1; into rank 1: e2 takes 1.
// Buffer: M*ceil(cf*T_max*K/M) = 2*2 = 4.
TEST(Capacity, SourceRuleBudgetsEachSourcePerDestination) {
  const CapacityPlan p = plan(CapacityRule::Source);
  EXPECT_EQ(p.accepted, (std::vector<int64_t>{2, 0, 1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(p.capacity_rows, 4);
}

// Rank rule: C = max(1, ceil(cf*T_max*K)) = 3 rows per destination rank, in local-expert-major, then
// source-rank order. Rank 0: e0 gives source 0 all 3, nothing is left for e1. Rank 1: e2 gives source 0 one
// and source 1 one. Buffer: C = 3.
TEST(Capacity, RankRuleCapsEachDestinationAndLowerSourcesWin) {
  const CapacityPlan p = plan(CapacityRule::Rank);
  EXPECT_EQ(p.accepted, (std::vector<int64_t>{3, 0, 1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(p.capacity_rows, 3);
}

// Expert rule: c_s = ceil(cf*T_s*K/E) rows per (source, expert): c_0 = ceil(0.75) = 1, c_1 = ceil(0.25) = 1.
// Buffer: M*E_L*ceil(cf*T_max*K/E) = 2*2*1 = 4.
TEST(Capacity, ExpertRuleCapsEachSourceExpertPair) {
  const CapacityPlan p = plan(CapacityRule::Expert);
  EXPECT_EQ(p.accepted, (std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(p.capacity_rows, 4);
}

// The buffer never exceeds the dropless bound: with cf = 4 the source rule's 2*ceil(4*3*2/2) = 24 rows are
// cut to 8, and everything is accepted.
TEST(Capacity, BufferIsAtMostTheDroplessBound) {
  const CapacityPlan p = plan_capacity(kRequests, kTokens, kTopK, ExpertPlacement(4, 2),
                                       CapacityPolicy::with(CapacityRule::Source, 4));
  EXPECT_EQ(p.accepted, kRequests);
  EXPECT_EQ(p.capacity_rows, 8);
}

// Every rank of 3 tokens: source rule 2*ceil(0.5*3*2/2) = 4; dropless 2*3*min(2, 2) = 12.
TEST(Capacity, MaxCapacityRowsIsThePlanWithEveryRankFull) {
  EXPECT_EQ(
      max_capacity_rows(3, kTopK, ExpertPlacement(4, 2), CapacityPolicy::with(CapacityRule::Source, kCf)), 4);
  EXPECT_EQ(max_capacity_rows(3, kTopK, ExpertPlacement(4, 2), CapacityPolicy::dropless()), 12);
}

TEST(Capacity, CeilRowsForgivesDecimalRounding) {
  EXPECT_EQ(ceil_rows(0.1 * 3 * 10), 3);  // 3.0000000000000004 in binary: cf=0.1 x 3 tokens x K=10
  EXPECT_EQ(ceil_rows(6.1), 7);
  EXPECT_EQ(ceil_rows(0.0), 0);
}

TEST(Capacity, RulesNeedAPositiveFactor) {
  EXPECT_THROW(CapacityPolicy::with(CapacityRule::Rank, 0.0).validate(), Error);
  EXPECT_NO_THROW(CapacityPolicy::dropless().validate());
  EXPECT_EQ(capacity_rule_from_name("expert"), CapacityRule::Expert);
  EXPECT_THROW(capacity_rule_from_name("token"), Error);
}

}  // namespace
}  // namespace expar
