// SymmetricHeap of the MPI backend, both kinds in every run: the shared-memory window (Auto) and the
// across-node path (ForceRemote: MPI_Win_allocate + MPI_Put/MPI_Get, as EXPAR_MPI_FORCE_REMOTE=1 selects).
#include <gtest/gtest.h>

#include <cstdlib>

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
  check_put_and_get_round_trip(mpi_world(), *make(), /*peers_mapped=*/!remote());
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
  EXPECT_EQ(remote->peer_ptr((world.rank() + 1) % world.size(), a), nullptr);
  EXPECT_NE(shared->peer_ptr((world.rank() + 1) % world.size(), b), nullptr);
  shared.reset();
  remote.reset();
}

}  // namespace
}  // namespace expar

int main(int argc, char** argv) {
  return expar::testing::mpi_test_main(argc, argv);
}
