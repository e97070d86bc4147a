// Every collective of the threads backend for 1..5 ranks, against results each rank computes locally. The
// checks are the ones the MPI test runs (collective_checks.hpp). The threads-only cases at the end are misuse
// that this backend reports on every member (mismatched counts or collectives, a rank left out of a
// partition), where MPI would hang or leave the result undefined.
#include <gtest/gtest.h>

#include "comm/collective_checks.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using namespace expar::testing;

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};

TEST_P(Collectives, AllReduceIsBitIdenticalToRankOrderFold) {
  run_ranks(ranks(), [](Comm& world) { check_all_reduce_all_types(world); });
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  run_ranks(ranks(), [](Comm& world) { check_broadcast(world); });
}

TEST_P(Collectives, AllGather) {
  run_ranks(ranks(), [](Comm& world) { check_all_gather(world); });
}

TEST_P(Collectives, AllGatherVWithUnevenAndZeroCounts) {
  run_ranks(ranks(), [](Comm& world) { check_all_gather_v(world); });
}

TEST_P(Collectives, ReduceScatter) {
  run_ranks(ranks(), [](Comm& world) { check_reduce_scatter(world); });
}

TEST_P(Collectives, ReduceScatterVWithUnevenAndZeroCounts) {
  run_ranks(ranks(), [](Comm& world) { check_reduce_scatter_v(world); });
}

TEST_P(Collectives, AllToAll) {
  run_ranks(ranks(), [](Comm& world) { check_all_to_all(world); });
}

TEST_P(Collectives, AllToAllVWithUnevenAndZeroSplits) {
  run_ranks(ranks(), [](Comm& world) {
    for (uint64_t use = 0; use < 4; ++use) check_all_to_all_v(world, use);
    EXPECT_EQ(world.stats().all_to_all_v, 4);
    world.reset_stats();
    EXPECT_EQ(world.stats().all_to_all_v, 0);
  });
}

TEST_P(Collectives, SplitOrdersByKeyThenRank) {
  run_ranks(ranks(), [](Comm& world) { check_split_orders_by_key_then_rank(world); });
}

TEST_P(Collectives, SplitListsThatDisagreeAreReportedOnEveryMember) {
  run_ranks(ranks(), [](Comm& world) { check_split_list_mismatch_is_reported_on_every_member(world); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4, 5));

TEST(Subgroups, EpMpAndEpDpUsedConcurrently) {
  run_ranks(4, [](Comm& world) { check_ep_mp_and_ep_dp_interleaved(world, 30); });
}

TEST(Subgroups, PartitionMustCoverEveryRank) {
  EXPECT_THROW(run_ranks(2, [](Comm& world) { world.subgroup({{0}}, "partial"); }), Error);
}

TEST(Mismatch, DifferentCountsAreReportedOnEveryMember) {
  run_ranks(3, [](Comm& world) {
    std::vector<float> send(8), recv(8 * 3);
    const size_t count = world.rank() == 1 ? 8 : 4;
    try {
      world.all_gather(send.data(), recv.data(), count, DType::F32);
      ADD_FAILURE() << "rank " << world.rank() << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("same count"), std::string::npos) << e.what();
    }
  });
}

TEST(Mismatch, DifferentCollectivesAreReported) {
  EXPECT_THROW(run_ranks(2,
                         [](Comm& world) {
                           if (world.rank() == 0) {
                             world.barrier();
                           } else {
                             int64_t x = 1;
                             world.all_reduce(std::span<int64_t>(&x, 1));
                           }
                         }),
               Error);
}

TEST(Mismatch, UnreducibleDtypeIsRejected) {
  run_ranks(1, [](Comm& world) {
    uint8_t x = 0;
    EXPECT_THROW(world.all_reduce(&x, 1, DType::U8, ReduceOp::Sum), Error);
  });
}

}  // namespace
}  // namespace expar
