// Every collective of the MPI backend, on whatever number of processes mpirun started (CTest: 2, 3, 4).
#include <gtest/gtest.h>

#include "comm/collective_checks.hpp"
#include "comm/mpi_test_main.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using namespace expar::testing;

TEST(MpiCollectives, AllReduceIsBitIdenticalToRankOrderFold) {
  auto& world = mpi_world();
  world.reset_stats();
  check_all_reduce_all_types(world);
  EXPECT_EQ(world.stats().all_reduce, 24);
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
  EXPECT_EQ(world.stats().all_to_all, 0);
}

TEST(MpiCollectives, SplitOrdersByKeyThenRank) {
  auto& world = mpi_world();
  const int me = world.rank();
  auto sub = world.split(me % 2, -me, "parity");
  std::vector<int> want;
  for (int r = world.size() - 1; r >= 0; --r)
    if (r % 2 == me % 2) want.push_back(r);
  EXPECT_EQ(sub->world_ranks(), want);
  check_all_reduce_all_types(*sub);
  check_all_to_all_v(*sub, 9);
  check_reduce_scatter_v(*sub);
}

TEST(MpiCollectives, EpMpAndEpDpSubgroupsInterleaved) {
  auto& world = mpi_world();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto mp = world.subgroup({{0, 1}, {2, 3}}, "ep_mp");
  auto dp = world.subgroup({{0, 2}, {1, 3}}, "ep_dp");
  const int me = world.rank();
  EXPECT_EQ(mp->world_ranks(), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
  EXPECT_EQ(dp->world_ranks(), (std::vector<int>{me % 2, me % 2 + 2}));
  for (uint64_t iter = 0; iter < 10; ++iter) {
    check_all_to_all_v(*mp, iter);
    check_all_reduce<float>(*dp, 33, ReduceOp::Sum, 100 + iter);
  }
}

TEST(MpiCollectives, SplitListMismatchIsReportedOnEveryMember) {
  auto& world = mpi_world();
  const auto n = static_cast<size_t>(world.size());
  std::vector<size_t> sc(n, 1), rc(n, 1);
  if (world.rank() == 0) rc[n - 1] = 2;
  std::vector<float> send(n), recv(n + 1);
  EXPECT_THROW(world.all_to_all_v(send.data(), sc, recv.data(), rc, DType::F32), Error);
  world.barrier();
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
