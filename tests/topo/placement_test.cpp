// Expert placement: contiguous (seed 002) and round-robin (seed 002 does not support it; we do).
#include "expar/topo/placement.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expar/core/error.hpp"

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

}  // namespace
}  // namespace expar
