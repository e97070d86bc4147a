// SymmetricHeap on the threads backend: put/get, quiet/barrier, signals, mismatches, memory accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "comm/comm_test_data.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

using testing::values_of;

class Heap : public ::testing::TestWithParam<int> {};

TEST_P(Heap, PutAndGetRoundTripLeaveTheElementPastTheEndUntouched) {
  run_ranks(GetParam(), [](Comm& world) {
    const int n = world.size(), me = world.rank();
    constexpr size_t kCount = 37;
    constexpr float kPoison = -1234.5f;
    auto heap = world.make_heap();
    // One slot of kCount per source rank, plus one poisoned element past the end.
    const size_t elems = kCount * static_cast<size_t>(n) + 1;
    BufferId buf = heap->allocate("inbox", elems * sizeof(float));
    auto* mine = static_cast<float*>(heap->local(buf));
    std::fill(mine, mine + elems, kPoison);
    heap->barrier();
    auto payload = values_of<float>(me, kCount, 50);
    for (int peer = 0; peer < n; ++peer)
      heap->put(peer, buf, static_cast<size_t>(me) * kCount * sizeof(float), payload.data(),
                kCount * sizeof(float));
    heap->quiet();
    heap->barrier();
    for (int s = 0; s < n; ++s) {
      auto want = values_of<float>(s, kCount, 50);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), mine + static_cast<size_t>(s) * kCount))
          << "from " << s;
    }
    EXPECT_EQ(mine[elems - 1], kPoison);
    // Read back my own slot from every peer with get, into a buffer one larger than needed.
    for (int peer = 0; peer < n; ++peer) {
      std::vector<float> back(kCount + 1, kPoison);
      heap->get(peer, buf, static_cast<size_t>(me) * kCount * sizeof(float), back.data(),
                kCount * sizeof(float));
      heap->quiet();
      EXPECT_TRUE(std::equal(payload.begin(), payload.end(), back.begin()));
      EXPECT_EQ(back.back(), kPoison);
      ASSERT_NE(heap->peer_ptr(peer, buf), nullptr);
      EXPECT_EQ(static_cast<float*>(heap->peer_ptr(peer, buf))[elems - 1], kPoison);
    }
    heap->barrier();
  });
}

TEST_P(Heap, ManyRowPutsAtRandomOffsetsLandExactly) {
  run_ranks(GetParam(), [](Comm& world) {
    const int n = world.size(), me = world.rank();
    constexpr size_t kRowBytes = 1000;  // not a multiple of anything convenient
    constexpr size_t kRowsPerSource = 24;
    auto heap = world.make_heap();
    BufferId buf = heap->allocate("rows", kRowBytes * kRowsPerSource * static_cast<size_t>(n));
    heap->barrier();
    // Source s writes its row j to row s*kRowsPerSource + perm_s(j) of every peer: a seeded permutation that
    // every rank can recompute.
    auto perm_of = [&](int s) {
      std::vector<size_t> p(kRowsPerSource);
      std::iota(p.begin(), p.end(), size_t{0});
      for (size_t i = kRowsPerSource - 1; i > 0; --i)
        std::swap(p[i], p[random_u32(testing::kSeed, 77 + static_cast<uint64_t>(s), i) % (i + 1)]);
      return p;
    };
    auto row_of = [&](int s, size_t j) {
      auto v = values_of<uint8_t>(s, kRowBytes, 60, j * kRowBytes);
      return v;
    };
    auto perm = perm_of(me);
    for (size_t j = 0; j < kRowsPerSource; ++j) {
      auto row = row_of(me, j);
      for (int k = 0; k < n; ++k) {
        int peer = (me + k) % n;
        heap->put(peer, buf, (static_cast<size_t>(me) * kRowsPerSource + perm[j]) * kRowBytes, row.data(),
                  kRowBytes);
      }
    }
    heap->barrier();
    auto* mine = static_cast<uint8_t*>(heap->local(buf));
    for (int s = 0; s < n; ++s) {
      auto p = perm_of(s);
      for (size_t j = 0; j < kRowsPerSource; ++j) {
        auto want = row_of(s, j);
        EXPECT_EQ(0, std::memcmp(mine + (static_cast<size_t>(s) * kRowsPerSource + p[j]) * kRowBytes,
                                 want.data(), kRowBytes))
            << "row " << j << " from " << s;
      }
    }
    heap->barrier();
  });
}

TEST_P(Heap, SignalsOrderPutsBeforeTheWake) {
  run_ranks(GetParam(), [](Comm& world) {
    const int n = world.size(), me = world.rank();
    auto heap = world.make_heap();
    BufferId buf = heap->allocate("ring", 64 * sizeof(int64_t));
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (uint64_t round = 1; round <= 20; ++round) {
      auto payload = values_of<int64_t>(me, 64, 70 + round);
      heap->put(next, buf, 0, payload.data(), 64 * sizeof(int64_t));
      heap->signal(next, 3, round);
      heap->wait_signal(3, round);
      auto want = values_of<int64_t>(prev, 64, 70 + round);
      EXPECT_EQ(0, std::memcmp(heap->local(buf), want.data(), 64 * sizeof(int64_t))) << "round " << round;
      heap->barrier();  // nobody overwrites the ring slot before its owner has read it
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Heap, ::testing::Values(1, 2, 3, 4, 5));

TEST(HeapErrors, AllocationMismatchIsReportedOnEveryMember) {
  run_ranks(3, [](Comm& world) {
    auto heap = world.make_heap();
    heap->allocate("a", 128);
    const size_t bytes = world.rank() == 2 ? 256 : 512;
    try {
      heap->allocate("b", bytes);
      ADD_FAILURE() << "rank " << world.rank() << " did not throw";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("'b'"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 2 allocates 'b' of 256 bytes"), std::string::npos) << m;
      EXPECT_NE(m.find("512"), std::string::npos) << m;
    }
    // A differently named buffer of the same size is a mismatch too.
    EXPECT_THROW(heap->allocate(world.rank() == 0 ? "c" : "d", 64), Error);
    heap->barrier();
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
