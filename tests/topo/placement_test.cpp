// Expert placement: contiguous (seed 002) and round-robin (seed 002 does not support it; we do).
#include "expar/topo/placement.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expar/core/error.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;

TEST(Placement, ContiguousBlocksAndGlobalToLocal) {
  const ExpertPlacement p(32, 8);
  EXPECT_EQ(p.local_count(), 4);
  EXPECT_EQ(p.local_experts(1), (std::vector<int>{4, 5, 6, 7}));  // seed 002: EP rank 1 needs experts 4-7
  EXPECT_EQ(p.owner(29), 7);
  EXPECT_EQ(p.local_index(29), 1);
  const auto map = p.global_to_local(1);
  ASSERT_EQ(map.size(), 32u);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(map[static_cast<size_t>(e)], e >= 4 && e < 8 ? e - 4 : -1) << e;
}

TEST(Placement, RoundRobinStridesAndInvertsExactly) {
  const ExpertPlacement p(12, 3, PlacementKind::RoundRobin);
  EXPECT_EQ(p.local_experts(2), (std::vector<int>{2, 5, 8, 11}));
  const auto map = p.global_to_local(2);
  for (int e = 0; e < 12; ++e) EXPECT_EQ(map[static_cast<size_t>(e)], e % 3 == 2 ? e / 3 : -1) << e;
  for (int e = 0; e < 12; ++e) EXPECT_EQ(p.global_expert(p.owner(e), p.local_index(e)), e);
}

TEST(Placement, NamesAndErrors) {
  EXPECT_EQ(placement_from_name("round-robin"), PlacementKind::RoundRobin);
  EXPECT_EQ(placement_name(PlacementKind::Contiguous), "contiguous");
  try {
    placement_from_name("striped");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'striped' is unknown"));
  }
  try {
    ExpertPlacement(30, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("num_experts=30 is not divisible by EP degree=4"));
    EXPECT_THAT(e.what(), HasSubstr("{1,2,3,5,6,10,15,30}"));
  }
}

// Slots (issue #36 item 1), worked by hand: E = 6 on 4 ranks in S = 8 slots, experts 0 and 3 replicated.
//   rank 0: slots 0, 1 (experts 0, 1)   rank 1: slots 2, 3 (experts 2, 3)
//   rank 2: slots 4, 5 (experts 4, 5)   rank 3: slots 6, 7 (experts 0, 3)
TEST(Placement, SlotTableWithReplicas) {
  const ExpertPlacement p = ExpertPlacement::from_slots(6, 4, {0, 1, 2, 3, 4, 5, 0, 3});
  EXPECT_EQ(p.num_experts(), 6);
  EXPECT_EQ(p.num_slots(), 8);
  EXPECT_EQ(p.redundant(), 2);
  EXPECT_TRUE(p.has_replicas());
  EXPECT_TRUE(p.explicit_slots());
  EXPECT_EQ(p.local_count(), 2);
  EXPECT_EQ(p.local_slots(3), (std::vector<int>{6, 7}));
  EXPECT_EQ(p.local_experts(3), (std::vector<int>{0, 3}));
  EXPECT_EQ(p.global_expert(3, 1), 3);
  EXPECT_EQ(p.slot(2, 1), 5);
  EXPECT_EQ(p.slot_rank(6), 3);
  EXPECT_EQ(p.slot_local(6), 0);
  EXPECT_EQ(p.slot_expert(7), 3);
  EXPECT_EQ(p.expert_slots(0), (std::vector<int>{0, 6}));
  EXPECT_EQ(p.expert_slots(3), (std::vector<int>{3, 7}));
  EXPECT_EQ(p.replica_count(5), 1);
  EXPECT_EQ(p.slot_to_local(3), (std::vector<int>{-1, -1, -1, -1, -1, -1, 0, 1}));
  // One slot: the seed-002 questions still have answers; several: refused, naming expert_slots.
  EXPECT_EQ(p.owner(5), 2);
  EXPECT_EQ(p.local_index(5), 1);
  try {
    (void)p.owner(0);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("expert_slots(0)"));
  }
  EXPECT_ANY_THROW((void)p.global_to_local(0));
}

// Without replicas slot id = expert id in the R = 0 layouts; an explicit table of E slots may order the
// experts freely, and then answers the seed-002 questions too.
TEST(Placement, WithoutReplicasSlotsAreExperts) {
  const ExpertPlacement rr(12, 3, PlacementKind::RoundRobin);
  EXPECT_EQ(rr.num_slots(), 12);
  EXPECT_FALSE(rr.has_replicas());
  for (int e = 0; e < 12; ++e) {
    EXPECT_EQ(rr.slot_expert(e), e);
    EXPECT_EQ(rr.slot(rr.owner(e), rr.local_index(e)), e);
  }
  EXPECT_EQ(rr.local_slots(2), (std::vector<int>{2, 5, 8, 11}));
  const ExpertPlacement table = ExpertPlacement::from_slots(4, 2, {3, 2, 1, 0});
  EXPECT_EQ(table.local_experts(0), (std::vector<int>{3, 2}));
  EXPECT_EQ(table.owner(0), 1);
  EXPECT_EQ(table.global_to_local(1), (std::vector<int>{1, 0, -1, -1}));
}

// E = 5 does not divide 4 ranks, but E + R = 8 slots do: expert_balance's placement runs as is.
TEST(Placement, FromTheBalancedPlacement) {
  ExpertBalanceInput in;
  in.loads = {50, 10, 10, 10, 20};
  in.redundant = 3;
  in.ep_size = 4;
  const ExpertBalance b = balance_experts(in);
  const ExpertPlacement p = ExpertPlacement::from_balance(b);
  EXPECT_EQ(p.num_slots(), 8);
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(p.slot_expert(s), b.slots[static_cast<size_t>(s)].expert) << s;
    EXPECT_EQ(p.slot_rank(s), b.slots[static_cast<size_t>(s)].rank) << s;
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.local_slots(r), b.rank_slots(r)) << r;
  for (int e = 0; e < 5; ++e) EXPECT_EQ(p.expert_slots(e), b.replicas[static_cast<size_t>(e)]) << e;
}

// Refusals name the fix.
TEST(Placement, SlotTableRefusals) {
  auto message = [](int experts, int ranks, std::vector<int> slots) {
    try {
      (void)ExpertPlacement::from_slots(experts, ranks, std::move(slots));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(message(5, 4, {0, 1, 2, 3, 4, 0}),
              HasSubstr("6 expert slots (5 experts + 1 redundant) are not divisible by EP degree=4"));
  EXPECT_THAT(message(5, 4, {0, 1, 2, 3, 4, 0}), HasSubstr("R = 3 is the next"));
  EXPECT_THAT(message(5, 2, {0, 1, 2, 3}), HasSubstr("4 expert slots cannot hold 5 experts"));
  EXPECT_THAT(message(5, 2, {0, 1, 2, 3, 3, 0}), HasSubstr("expert 4 has no slot"));
  EXPECT_THAT(message(5, 2, {0, 1, 2, 3, 4, 7}), HasSubstr("slot 5 names expert 7, which does not exist"));
  EXPECT_THAT(message(5, 2, {0, 1, 2, 3, 4, -1}), HasSubstr("slot 5 names expert -1"));
}

}  // namespace
}  // namespace expar
