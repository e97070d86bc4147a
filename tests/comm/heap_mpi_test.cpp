// SymmetricHeap of the MPI backend, both kinds in every run: the shared-memory window (Auto) and the
// across-node path (ForceRemote: MPI_Win_allocate + MPI_Put/MPI_Get, as EXPAR_MPI_FORCE_REMOTE=1 selects).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/heap_checks.hpp"
#include "comm/mpi_test_main.hpp"
#include "expar/comm/mpi/mpi_heap.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using namespace expar::testing;

class MpiHeapTest : public ::testing::TestWithParam<mpi::HeapMode> {
 protected:
  std::unique_ptr<SymmetricHeap> make() { return mpi_world().make_heap(GetParam()); }
  bool remote() const { return GetParam() == mpi::HeapMode::ForceRemote; }
};

TEST_P(MpiHeapTest, PutAndGetRoundTripLeaveTheElementPastTheEndUntouched) {
  check_put_and_get_round_trip(mpi_world(), *make(), /*node_peers_mapped=*/!remote());
}

TEST_P(MpiHeapTest, ManyRowPutsAtRandomOffsetsLandExactly) {
  check_many_row_puts_land_exactly(mpi_world(), *make());
}

TEST_P(MpiHeapTest, SignalsOrderPutsBeforeTheWake) {
  check_signals_order_puts_before_the_wake(mpi_world(), *make());
}

TEST_P(MpiHeapTest, AllocationMismatchIsReportedOnEveryMember) {
  check_allocation_mismatch_is_reported_on_every_member(mpi_world(), *make());
}

TEST_P(MpiHeapTest, AllocationsAreChargedAndCreditedBack) {
  const int64_t before = current_tracker().snapshot().current_of(MemCategory::CommScratch);
  {
    auto heap = make();
    heap->allocate("scratch", 300, MemCategory::CommScratch);
    EXPECT_EQ(current_tracker().snapshot().current_of(MemCategory::CommScratch), before + 300);
    heap->barrier();
  }
  EXPECT_EQ(current_tracker().snapshot().current_of(MemCategory::CommScratch), before);
}

INSTANTIATE_TEST_SUITE_P(Kinds, MpiHeapTest,
                         ::testing::Values(mpi::HeapMode::Auto, mpi::HeapMode::ForceRemote),
                         [](const auto& info) {
                           return info.param == mpi::HeapMode::Auto ? std::string("SharedWindow")
                                                                    : std::string("ForceRemote");
                         });

TEST(MpiHeapEnv, ForceRemoteVariableSelectsTheAcrossNodePath) {
  auto& world = mpi_world();
  setenv("EXPAR_MPI_FORCE_REMOTE", "1", 1);
  auto remote = world.make_heap();
  unsetenv("EXPAR_MPI_FORCE_REMOTE");
  auto shared = world.make_heap();
  BufferId a = remote->allocate("x", 64);
  BufferId b = shared->allocate("x", 64);
  const int next = (world.rank() + 1) % world.size();
  EXPECT_EQ(remote->peer_ptr(next, a), nullptr);
  EXPECT_EQ(shared->peer_ptr(next, b) != nullptr, !world.nodes().across(world.rank(), next));
  shared.reset();
  remote.reset();
}

// The node of each rank comes from MPI (MPI_COMM_TYPE_SHARED). Under scripts/mpirun-local all ranks share one
// node; under scripts/mpirun-nodes N K, rank r is on node r / K (Open MPI fills each node's slots in order),
// which the script exports as EXPAR_NODES_RANKS_PER_NODE.
TEST(MpiNodes, EveryRankKnowsTheNodeOfEveryMember) {
  auto& world = mpi_world();
  const char* per_node = std::getenv("EXPAR_NODES_RANKS_PER_NODE");
  const int k = per_node != nullptr ? std::atoi(per_node) : world.size();
  ASSERT_GT(k, 0);
  ASSERT_EQ(world.nodes().node_of.size(), static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) EXPECT_EQ(world.nodes().node_of[static_cast<size_t>(r)], r / k) << r;
  EXPECT_EQ(world.nodes().num_nodes, (world.size() + k - 1) / k);
  // A split keeps the nodes: the odd ranks' group numbers its nodes in its own member order.
  auto odd = world.split(world.rank() % 2, world.rank(), "parity");
  for (int m = 0; m < odd->size(); ++m) {
    const int w = odd->world_ranks()[static_cast<size_t>(m)];
    const int first = odd->world_ranks()[0];
    EXPECT_EQ(odd->nodes().across(0, m), w / k != first / k) << "member " << m;
  }
  // Collectives count one message per peer, split by node.
  world.reset_stats();
  std::vector<float> send(static_cast<size_t>(world.size()) * 3, 1.0f), recv(send.size());
  world.all_to_all(send.data(), recv.data(), 3, DType::F32);
  int64_t across = 0;
  for (int r = 0; r < world.size(); ++r) across += world.nodes().across(world.rank(), r) ? 1 : 0;
  EXPECT_EQ(world.stats().traffic.inter_node_messages, across);
  EXPECT_EQ(world.stats().traffic.inter_node_bytes, across * 12);
  EXPECT_EQ(world.stats().traffic.intra_node_messages, world.size() - 1 - across);
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
