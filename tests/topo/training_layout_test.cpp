// Training layouts: seed 000 §5.1 (eq. 8, Figures 11 and 13) and the CP/TP/PP folding documented in
// topo/training_layout.hpp.
#include "expar/topo/training_layout.hpp"

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

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Figures 11 and 13: D=4 ranks, N=16 experts, M_E=2, D_E=2.
TEST(TrainingLayout, FourGpuExampleOfFigures11And13) {
  const TrainingLayout l(4, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.ep_mp, 2);
  EXPECT_EQ(l.ep_dp, 2);
  EXPECT_EQ(l.groups(TrainingGroup::EpMp), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(l.groups(TrainingGroup::EpDp), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(l.groups(TrainingGroup::DenseGrad), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(l.groups(TrainingGroup::Dp), (Groups{{0, 1, 2, 3}}));
  // Figure 11 writes coordinates as (EP_DP, EP_MP): GPU 0 (0,0), GPU 1 (0,1), GPU 2 (1,0), GPU 3 (1,1).
  const int expect_ep_dp[] = {0, 0, 1, 1}, expect_ep_mp[] = {0, 1, 0, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(l.coords(r).ep_dp, expect_ep_dp[r]) << "rank " << r;
    EXPECT_EQ(l.coords(r).ep_mp, expect_ep_mp[r]) << "rank " << r;
  }
  // Experts 0-7 on ranks 0 and 2, 8-15 on ranks 1 and 3: 8 of 16 per rank (eq. 9, P_E / 2).
  EXPECT_EQ(l.local_experts(0, 16), iota(0, 8));
  EXPECT_EQ(l.local_experts(1, 16), iota(8, 16));
  EXPECT_EQ(l.local_experts(2, 16), iota(0, 8));
  EXPECT_EQ(l.local_experts(3, 16), iota(8, 16));
  // The route of Figure 11: a token on GPU 0 that picks expert 12 goes to the EP_MP peer that stores it.
  const ExpertPlacement p = l.expert_placement(16);
  EXPECT_EQ(l.group_of(0, TrainingGroup::EpMp)[static_cast<size_t>(p.owner(12))], 1);
  EXPECT_EQ(l.group_of(2, TrainingGroup::EpMp)[static_cast<size_t>(p.owner(12))], 3);
}

TEST(TrainingLayout, RoundRobinPlacementOverEpMp) {
  const TrainingLayout l(4, 2);
  EXPECT_EQ(l.local_experts(0, 16, PlacementKind::RoundRobin), (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(l.local_experts(3, 16, PlacementKind::RoundRobin), (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
}

// CP folding: W=8, C=2 gives D=4 dense replicas of 2 CP ranks; D*C = 8 = M_E*D_E = 4*2.
TEST(TrainingLayout, ContextParallelFoldsIntoExpertAxes) {
  const TrainingLayout l(8, 4, /*cp=*/2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.cp, 2);
  EXPECT_EQ(l.ep_dp, 2);
  EXPECT_EQ(l.dp * l.cp, l.ep_mp * l.ep_dp);
  EXPECT_EQ(l.groups(TrainingGroup::Cp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::Dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::DenseGrad), (Groups{iota(0, 8)}));
  EXPECT_EQ(l.groups(TrainingGroup::EpMp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::EpDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const TrainingCoords c = l.coords(5);  // 5 = (dp 2 * C 2 + cp 1) = ep_dp 1 * M_E 4 + ep_mp 1
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.cp, 1);
  EXPECT_EQ(c.ep_dp, 1);
  EXPECT_EQ(c.ep_mp, 1);
  EXPECT_EQ(l.rank_of(0, 2, 1, 0), 5);
  EXPECT_EQ(l.rank_of_expert_coords(0, 1, 1), 5);
}

TEST(TrainingLayout, PipelineStagesRepeatTheStageLayout) {
  const TrainingLayout l(8, 2, 1, 1, /*pp=*/2);
  EXPECT_EQ(l.stage_size, 4);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.groups(TrainingGroup::EpMp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::EpDp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::Pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.coords(6).stage, 1);
  EXPECT_EQ(l.local_experts(6, 16), iota(0, 8));
}

TEST(TrainingLayout, TensorParallelIsFastestAxis) {
  const TrainingLayout l(8, 2, 1, /*tp=*/2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.groups(TrainingGroup::Tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(TrainingGroup::DenseGrad), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.ep_dp, 4);
}

// Every group kind of every layout below partitions the world, sizes match, membership is symmetric and
// coordinates round-trip.
TEST(TrainingLayout, GroupsPartitionTheWorldForManyLayouts) {
  const TrainingGroup kinds[] = {TrainingGroup::Dp,  TrainingGroup::Cp,        TrainingGroup::Tp,
                                 TrainingGroup::Pp,  TrainingGroup::DenseGrad, TrainingGroup::EpMp,
                                 TrainingGroup::EpDp};
  int checked = 0;
  for (int world : {1, 2, 4, 6, 8, 12, 16, 24})
    for (int pp : {1, 2, 3})
      for (int tp : {1, 2})
        for (int cp : {1, 2, 3}) {
          if (world % (pp * tp * cp) != 0) continue;
          const int stage = world / pp;
          for (int me = 1; me <= stage; ++me) {
            if (stage % me != 0) continue;
            const TrainingLayout l(world, me, cp, tp, pp);
            ASSERT_EQ(l.dp * l.cp * l.tp, l.ep_mp * l.ep_dp);
            ASSERT_EQ(l.pp * l.stage_size, world);
            for (int r = 0; r < world; ++r) {
              const TrainingCoords c = l.coords(r);
              ASSERT_EQ(l.rank_of(c.stage, c.dp, c.cp, c.tp), r);
              ASSERT_EQ(l.rank_of_expert_coords(c.stage, c.ep_dp, c.ep_mp), r);
            }
            for (TrainingGroup kind : kinds) {
              std::vector<int> seen(static_cast<size_t>(world), 0);
              for (const auto& g : l.groups(kind)) {
                ASSERT_EQ(static_cast<int>(g.size()), l.group_size(kind)) << training_group_name(kind);
                for (int m : g) {
                  ++seen[static_cast<size_t>(m)];
                  ASSERT_EQ(l.group_of(m, kind), g);
                }
              }
              ASSERT_EQ(seen, std::vector<int>(static_cast<size_t>(world), 1)) << training_group_name(kind);
            }
            ++checked;
          }
        }
  EXPECT_GT(checked, 50);
}

TEST(TrainingLayout, ErrorsNameValuesAndValidChoices) {
  auto msg = error_of([] { TrainingLayout(6, 1, 4); });
  EXPECT_THAT(msg, HasSubstr("W=6"));
  EXPECT_THAT(msg, HasSubstr("C*TP*PP=4*1*1=4"));
  EXPECT_THAT(msg, HasSubstr("choose C in {1,2,3,6}"));

  msg = error_of([] { TrainingLayout(8, 3); });
  EXPECT_THAT(msg, HasSubstr("M_E=3"));
  EXPECT_THAT(msg, HasSubstr("D*C*TP=8*1*1=8"));
  EXPECT_THAT(msg, HasSubstr("choose M_E in {1,2,4,8}"));

  EXPECT_THAT(error_of([] { TrainingLayout(0, 1); }), HasSubstr("W=0 must be at least 1"));
  EXPECT_THAT(error_of([] { TrainingLayout(4, 0); }), HasSubstr("M_E=0 must be at least 1"));
  EXPECT_THAT(error_of([] { TrainingLayout(4, 1, 0); }), HasSubstr("C=0 must be at least 1"));
  EXPECT_THAT(error_of([] { TrainingLayout(4, 2).coords(4); }), HasSubstr("rank 4 is out of range [0, 4)"));
  // 16 experts cannot be split over M_E = 3 ranks (W = 6).
  msg = error_of([] { TrainingLayout(6, 3).expert_placement(16); });
  // The M_E suggested divide both the 6 ranks of the stage and the 16 experts.
  EXPECT_THAT(msg, HasSubstr("num_experts=16 is not divisible by EP_MP degree M_E=3: choose M_E in {1,2}"));
}

}  // namespace
}  // namespace expar
