// Symmetric-buffer leases (seed 000 §5.7, Figures 21 and 22) on the threads backend's heap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/lease_pool.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;

TEST(LeasePool, PayloadOverwrittenInOneSharedBufferIsCaught) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 256);
    // Forward blocks 1, 2, 3 all write their dispatch payload into the one shared buffer...
    std::vector<LeasePool::Handle> saved;
    for (int block = 1; block <= 3; ++block) saved.push_back(pool.acquire_scratch({block, 0}));
    // ...so backward in reverse order finds block 3's payload intact and the others overwritten.
    EXPECT_NO_THROW(pool.check(saved[2]));
    try {
      pool.check(saved[0]);
      ADD_FAILURE() << "block 1 read block 3's payload without an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("block 1 microbatch 0"));
      EXPECT_THAT(e.what(), HasSubstr("overwritten by block 3"));
    }
    EXPECT_THROW(pool.check(saved[1]), Error);
    EXPECT_EQ(pool.resident_bytes(), 256u);  // one shared buffer: constant footprint
  });
}

TEST(LeasePool, LeasesKeepEveryBlocksPayloadUntilItsBackward) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 64);
    std::vector<LeasePool::Handle> saved;
    for (int block = 1; block <= 3; ++block) {
      saved.push_back(pool.acquire({block, 0}));
      auto* p = static_cast<float*>(pool.data(saved.back()));
      for (int i = 0; i < 16; ++i) p[i] = static_cast<float>(block * 100 + world.rank());
    }
    EXPECT_EQ(pool.slot_count(), 3);
    EXPECT_EQ(pool.resident_bytes(), 3u * 64u);  // private per block: grows with the blocks
    for (int block = 3; block >= 1; --block) {
      auto& h = saved[static_cast<size_t>(block - 1)];
      EXPECT_NO_THROW(pool.check(h));
      EXPECT_EQ(static_cast<float*>(pool.data(h))[15], static_cast<float>(block * 100 + world.rank()));
      pool.release(h);
    }
    EXPECT_EQ(pool.leased_count(), 0);
    EXPECT_EQ(pool.high_water(), 3);
  });
}

TEST(LeasePool, ALeasedSlotIsNeverHandedOutAgainAndFreedSlotsAreReused) {
  run_ranks(1, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 32);
    auto a = pool.acquire({0, 0});
    auto b = pool.acquire({0, 1});
    EXPECT_NE(a.slot, b.slot);
    pool.release(a);
    auto c = pool.acquire({0, 2});
    EXPECT_EQ(c.slot, a.slot);  // the released slot comes back
    EXPECT_NE(c.slot, b.slot);
    EXPECT_THROW(pool.check(a), Error);  // a's payload belongs to c now
    EXPECT_EQ(pool.slot_count(), 2);
  });
}

TEST(LeasePool, SecondReleaseIsAnError) {
  run_ranks(1, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 32);
    auto a = pool.acquire({2, 0});
    LeasePool::Handle copy = a;
    pool.release(a);
    try {
      pool.release(copy);
      ADD_FAILURE() << "a second release went through";
    } catch (const InternalError& e) {
      // A bug in the caller, not something a user's input can cause: it reads as one.
      EXPECT_THAT(e.what(), HasSubstr("internal error at"));
      EXPECT_THAT(e.what(), HasSubstr("lease_pool.cpp"));
      EXPECT_THAT(e.what(), HasSubstr("released twice"));
    }
    EXPECT_THROW(pool.release(a), Error);  // the handle itself knows it holds nothing
  });
}

TEST(LeasePool, FrozenPoolRefusesToGrowAndSaysHowManySlotsWereNeeded) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 32);
    // Dry run: two microbatches in flight at most.
    auto a = pool.acquire({0, 0});
    auto b = pool.acquire({0, 1});
    pool.release(a);
    pool.release(b);
    pool.freeze();
    auto c = pool.acquire({0, 0});
    auto d = pool.acquire({0, 1});
    try {
      pool.acquire({0, 2});
      ADD_FAILURE() << "a frozen pool grew";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("frozen with 2 slots"));
      EXPECT_THAT(e.what(), HasSubstr("3 slots needed"));
      EXPECT_THAT(e.what(), HasSubstr("block 0 microbatch 2"));
      // The fix names flags `expar train` has.
      EXPECT_THAT(e.what(), HasSubstr("--microbatches"));
      EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("--lease-slots")));
    }
    pool.release(c);
    pool.release(d);
  });
}

// Freezing stops scratch growth too: a scratch role the dry run used keeps working, a new one is refused
// (resident symmetric memory is fixed after the dry run), and nothing was allocated for it.
TEST(LeasePool, FrozenPoolRefusesANewScratchSlot) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 64);
    pool.acquire_scratch({0, 0}, 0);
    pool.freeze();
    EXPECT_NO_THROW(pool.acquire_scratch({1, 3}, 0));
    try {
      pool.acquire_scratch({1, 3}, 1);
      ADD_FAILURE() << "a frozen pool allocated a new scratch slot";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("frozen"));
      EXPECT_THAT(e.what(), HasSubstr("block 1 microbatch 3"));
      EXPECT_THAT(e.what(), HasSubstr("scratch slot 1"));
      EXPECT_THAT(e.what(), HasSubstr("--recompute-moe"));
    }
    EXPECT_EQ(pool.scratch_count(), 1);
    EXPECT_EQ(pool.resident_bytes(), 64u);
  });
}

// Two scratch roles (the expert output and, under activation recomputation, the dispatch payload): each is
// its own shared slot with its own generation, allocated on first use; neither is a lease.
TEST(LeasePool, ScratchSlotsAreIndependentAndHoldNoLease) {
  run_ranks(2, [](Comm& world) {
    auto heap = world.make_heap();
    LeasePool pool(*heap, "dispatch", 64);
    auto out = pool.acquire_scratch({1, 0}, 0);
    EXPECT_EQ(pool.scratch_count(), 1);
    auto payload = pool.acquire_scratch({1, 0}, 1);
    EXPECT_EQ(pool.scratch_count(), 2);
    EXPECT_NE(out.buffer, payload.buffer);
    EXPECT_FALSE(payload.leased);
    EXPECT_EQ(pool.leased_count(), 0);
    EXPECT_EQ(pool.slot_count(), 0);
    EXPECT_EQ(pool.resident_bytes(), 2u * 64u);
    // Block 2 reuses the output scratch: block 1's payload in the other slot is untouched...
    auto out2 = pool.acquire_scratch({2, 0}, 0);
    EXPECT_NO_THROW(pool.check(payload));
    EXPECT_NO_THROW(pool.check(out2));
    EXPECT_THROW(pool.check(out), Error);
    // ...until block 2 puts its own payload there.
    pool.acquire_scratch({2, 0}, 1);
    try {
      pool.check(payload);
      ADD_FAILURE() << "an overwritten scratch payload passed the check";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("shared scratch slot 1"));
      EXPECT_THAT(e.what(), HasSubstr("overwritten by block 2"));
    }
    EXPECT_THROW(pool.release(payload), Error);  // scratch is never released
    try {
      pool.acquire_scratch({3, 0}, LeasePool::kScratchSlots);
      ADD_FAILURE() << "a scratch slot past the last one was handed out";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("scratch slot 2"));
    }
  });
}

}  // namespace
}  // namespace expar
