// SymmetricHeap on the threads backend: the shared heap checks (heap_checks.hpp) for 1..5 ranks, then range
// errors and memory accounting.
#include <gtest/gtest.h>

#include "comm/heap_checks.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using namespace expar::testing;

class Heap : public ::testing::TestWithParam<int> {};

TEST_P(Heap, PutAndGetRoundTripLeaveTheElementPastTheEndUntouched) {
  run_ranks(GetParam(), [](Comm& world) {
    auto heap = world.make_heap();
    check_put_and_get_round_trip(world, *heap, /*node_peers_mapped=*/true);
  });
}

// Emulated nodes (LaunchOptions::ranks_per_node): peers of another node are not mapped, their rows are
// counted as messages across nodes; the same checks hold.
TEST(HeapEmulatedNodes, PeersOfAnotherNodeAreReachedByCountedMessagesOnly) {
  for (int per_node : {1, 2, 3}) {
    LaunchOptions options;
    options.ranks = 6;
    options.ranks_per_node = per_node;
    run_ranks(options, [&](Comm& world) {
      EXPECT_EQ(world.nodes().num_nodes, 6 / per_node);
      EXPECT_EQ(world.node(), world.rank() / per_node);
      auto heap = world.make_heap();
      check_put_and_get_round_trip(world, *heap, /*node_peers_mapped=*/true);
      check_many_row_puts_land_exactly(world, *heap);
      check_signals_order_puts_before_the_wake(world, *heap);
    });
  }
}

TEST(HeapEmulatedNodes, RanksPerNodeMustDivideTheRanks) {
  LaunchOptions options;
  options.ranks = 6;
  options.ranks_per_node = 4;
  try {
    run_ranks(options, [](Comm&) {});
    FAIL() << "ranks_per_node=4 with 6 ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks_per_node = 4 with 6 ranks"), std::string::npos) << e.what();
  }
}

TEST_P(Heap, ManyRowPutsAtRandomOffsetsLandExactly) {
  run_ranks(GetParam(), [](Comm& world) { check_many_row_puts_land_exactly(world, *world.make_heap()); });
}

TEST_P(Heap, SignalsOrderPutsBeforeTheWake) {
  run_ranks(GetParam(),
            [](Comm& world) { check_signals_order_puts_before_the_wake(world, *world.make_heap()); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Heap, ::testing::Values(1, 2, 3, 4, 5));

TEST(HeapErrors, AllocationMismatchIsReportedOnEveryMember) {
  run_ranks(3, [](Comm& world) {
    check_allocation_mismatch_is_reported_on_every_member(world, *world.make_heap());
  });
}

TEST(HeapErrors, OutOfRangeAccessIsRejected) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    BufferId buf = heap->allocate("x", 16);
    char data[32] = {};
    EXPECT_THROW(heap->put(1, buf, 8, data, 9), Error);
    EXPECT_THROW(heap->get(2, buf, 0, data, 1), Error);
    EXPECT_THROW(heap->put(0, buf + 1, 0, data, 1), Error);
    EXPECT_THROW(heap->signal(0, SymmetricHeap::kSignalSlots, 1), Error);
    heap->put(1 - world.rank(), buf, 16, data, 0);  // zero bytes at the end is legal
    heap->barrier();
  });
}

TEST(HeapMemory, AllocationsAreChargedToTheCallersTrackerAndCreditedBack) {
  LaunchOptions options;
  options.ranks = 3;
  auto snapshots = run_ranks_tracked(options, [](Comm& world) {
    const int64_t before = current_tracker().snapshot().current_of(MemCategory::CommScratch);
    {
      auto heap = world.make_heap();
      heap->allocate("sym", 1000);
      heap->allocate("scratch", 100 * static_cast<size_t>(world.rank() + 1) * 0 + 300,
                     MemCategory::CommScratch);
      auto s = current_tracker().snapshot();
      EXPECT_EQ(s.current_of(MemCategory::SymmetricBuffers), 1000);
      EXPECT_EQ(s.current_of(MemCategory::CommScratch), before + 300);
      heap->barrier();
    }
    EXPECT_EQ(current_tracker().snapshot().current_of(MemCategory::SymmetricBuffers), 0);
  });
  ASSERT_EQ(snapshots.size(), 3u);
  for (const auto& s : snapshots) {
    EXPECT_EQ(s.current_of(MemCategory::SymmetricBuffers), 0);
    EXPECT_EQ(s.peak_of(MemCategory::SymmetricBuffers), 1000);
    EXPECT_EQ(s.peak_of(MemCategory::CommScratch), 300);
  }
}

}  // namespace
}  // namespace expar
