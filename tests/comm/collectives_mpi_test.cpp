// Every collective of the MPI backend, on whatever number of processes mpirun started (CTest: 2, 3, 4).
#include <gtest/gtest.h>

#include "comm/collective_checks.hpp"
#include "comm/mpi_test_main.hpp"

namespace expar {
namespace {

using namespace expar::testing;

TEST(MpiCollectives, AllReduceIsBitIdenticalToRankOrderFold) {
  check_all_reduce_all_types(mpi_world());
}
TEST(MpiCollectives, Broadcast) {
  check_broadcast(mpi_world());
}
TEST(MpiCollectives, AllGather) {
  check_all_gather(mpi_world());
}
TEST(MpiCollectives, AllGatherV) {
  check_all_gather_v(mpi_world());
}
TEST(MpiCollectives, ReduceScatter) {
  check_reduce_scatter(mpi_world());
}
TEST(MpiCollectives, ReduceScatterV) {
  check_reduce_scatter_v(mpi_world());
}
TEST(MpiCollectives, AllToAll) {
  check_all_to_all(mpi_world());
}

TEST(MpiCollectives, AllToAllVAndStats) {
  auto& world = mpi_world();
  world.reset_stats();
  for (uint64_t use = 0; use < 4; ++use) check_all_to_all_v(world, use);
  EXPECT_EQ(world.stats().all_to_all_v, 4);
  world.reset_stats();
  EXPECT_EQ(world.stats().all_to_all_v, 0);
}

TEST(MpiCollectives, SplitOrdersByKeyThenRank) {
  check_split_orders_by_key_then_rank(mpi_world());
}

TEST(MpiCollectives, EpMpAndEpDpSubgroupsInterleaved) {
  if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_ep_mp_and_ep_dp_interleaved(mpi_world(), 10);
}

TEST(MpiCollectives, SplitListMismatchIsReportedOnEveryMember) {
  check_split_list_mismatch_is_reported_on_every_member(mpi_world());
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
