#pragma once
// Checks of a SymmetricHeap that every backend's heap test runs (heap_threads_test for 1..5 threads,
// heap_mpi_test for 2..4 processes and both MPI heap kinds). They are functions over (group, heap) rather
// than one typed test, because the backends launch their ranks differently: threads inside each test, MPI as
// the processes of the whole executable. Failures use EXPECT, so every member keeps making the same
// collective calls.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "comm/comm_test_data.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"

namespace expar::testing {

// Every member puts one slot into every peer's inbox, then gets its own slot back from every peer; the
// element past the end stays poisoned. `node_peers_mapped`: whether peer_ptr gives direct access to the
// peers on my node (a shared window); peers on other nodes are never mapped. The heap's traffic statistics
// count exactly one put and one get per peer, split by node.
inline void check_put_and_get_round_trip(Comm& world, SymmetricHeap& heap, bool node_peers_mapped) {
  const int n = world.size(), me = world.rank();
  ASSERT_EQ(heap.nodes().node_of, world.nodes().node_of);
  heap.reset_stats();
  constexpr size_t kCount = 37;
  constexpr float kPoison = -1234.5f;
  // One slot of kCount per source rank, plus one poisoned element past the end.
  const size_t elems = kCount * static_cast<size_t>(n) + 1;
  BufferId buf = heap.allocate("inbox", elems * sizeof(float));
  auto* mine = static_cast<float*>(heap.local(buf));
  std::fill(mine, mine + elems, kPoison);
  heap.barrier();
  auto payload = values_of<float>(me, kCount, 50);
  for (int peer = 0; peer < n; ++peer)
    heap.put(peer, buf, static_cast<size_t>(me) * kCount * sizeof(float), payload.data(),
             kCount * sizeof(float));
  heap.quiet();
  heap.barrier();
  for (int s = 0; s < n; ++s) {
    auto want = values_of<float>(s, kCount, 50);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), mine + static_cast<size_t>(s) * kCount)) << "from " << s;
  }
  EXPECT_EQ(mine[elems - 1], kPoison);
  // Read back my own slot from every peer with get, into a buffer one larger than needed.
  for (int peer = 0; peer < n; ++peer) {
    std::vector<float> back(kCount + 1, kPoison);
    heap.get(peer, buf, static_cast<size_t>(me) * kCount * sizeof(float), back.data(),
             kCount * sizeof(float));
    heap.quiet();
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), back.begin()));
    EXPECT_EQ(back.back(), kPoison);
    const auto* peer_elems = static_cast<const float*>(heap.peer_ptr(peer, buf));
    EXPECT_EQ(peer_elems != nullptr, node_peers_mapped && !world.nodes().across(me, peer)) << "peer " << peer;
    if (peer_elems != nullptr) {
      EXPECT_EQ(peer_elems[elems - 1], kPoison) << "peer " << peer;
    }
  }
  heap.barrier();
  int64_t on_my_node = 0;
  for (int peer = 0; peer < n; ++peer) on_my_node += world.nodes().across(me, peer) ? 0 : 1;
  const auto slot = static_cast<int64_t>(kCount * sizeof(float));
  for (const TrafficStats* t : {&heap.stats().puts, &heap.stats().gets}) {
    EXPECT_EQ(t->intra_node_messages, on_my_node);
    EXPECT_EQ(t->intra_node_bytes, on_my_node * slot);
    EXPECT_EQ(t->inter_node_messages, n - on_my_node);
    EXPECT_EQ(t->inter_node_bytes, (n - on_my_node) * slot);
  }
}

// Source s writes its row j to row s*kRowsPerSource + perm_s(j) of every peer: a seeded permutation that
// every member can recompute.
inline void check_many_row_puts_land_exactly(Comm& world, SymmetricHeap& heap) {
  const int n = world.size(), me = world.rank();
  constexpr size_t kRowBytes = 1000;  // not a multiple of anything convenient
  constexpr size_t kRowsPerSource = 24;
  BufferId buf = heap.allocate("rows", kRowBytes * kRowsPerSource * static_cast<size_t>(n));
  heap.barrier();
  auto perm_of = [&](int s) {
    std::vector<size_t> p(kRowsPerSource);
    std::iota(p.begin(), p.end(), size_t{0});
    for (size_t i = kRowsPerSource - 1; i > 0; --i)
      std::swap(p[i], p[random_u32(kSeed, 77 + static_cast<uint64_t>(s), i) % (i + 1)]);
    return p;
  };
  auto perm = perm_of(me);
  // Rows must stay unchanged until the barrier (which completes the puts): MPI_Put may read them late.
  std::vector<std::vector<uint8_t>> rows;
  for (size_t j = 0; j < kRowsPerSource; ++j)
    rows.push_back(values_of<uint8_t>(me, kRowBytes, 60, j * kRowBytes));
  for (size_t j = 0; j < kRowsPerSource; ++j)
    for (int k = 0; k < n; ++k)
      heap.put((me + k) % n, buf, (static_cast<size_t>(me) * kRowsPerSource + perm[j]) * kRowBytes,
               rows[j].data(), kRowBytes);
  heap.barrier();
  auto* mine = static_cast<uint8_t*>(heap.local(buf));
  for (int s = 0; s < n; ++s) {
    auto p = perm_of(s);
    for (size_t j = 0; j < kRowsPerSource; ++j) {
      auto want = values_of<uint8_t>(s, kRowBytes, 60, j * kRowBytes);
      EXPECT_EQ(0, std::memcmp(mine + (static_cast<size_t>(s) * kRowsPerSource + p[j]) * kRowBytes,
                               want.data(), kRowBytes))
          << "row " << j << " from " << s;
    }
  }
  heap.barrier();
}

// A ring: each member puts a payload to the next and signals it; the wake must come after the data landed.
inline void check_signals_order_puts_before_the_wake(Comm& world, SymmetricHeap& heap) {
  const int n = world.size(), me = world.rank();
  BufferId buf = heap.allocate("ring", 64 * sizeof(int64_t));
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (uint64_t round = 1; round <= 20; ++round) {
    auto payload = values_of<int64_t>(me, 64, 70 + round);
    heap.put(next, buf, 0, payload.data(), 64 * sizeof(int64_t));
    heap.signal(next, 3, round);
    heap.wait_signal(3, round);
    auto want = values_of<int64_t>(prev, 64, 70 + round);
    EXPECT_EQ(0, std::memcmp(heap.local(buf), want.data(), 64 * sizeof(int64_t))) << "round " << round;
    heap.barrier();  // nobody overwrites the ring slot before its owner has read it
  }
}

// The last member asks for another size than the others (needs 2 or more members): every member throws a
// message naming the buffer, the odd member and both sizes; a different name of the same size is a mismatch
// too; the heap is still usable afterwards.
inline void check_allocation_mismatch_is_reported_on_every_member(Comm& world, SymmetricHeap& heap) {
  heap.allocate("a", 128);
  const int last = world.size() - 1;
  const size_t bytes = world.rank() == last ? 256 : 512;
  try {
    heap.allocate("b", bytes);
    ADD_FAILURE() << "rank " << world.rank() << " did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'b'"), std::string::npos) << m;
    EXPECT_NE(m.find(fmt::format("rank {} allocates 'b' of 256 bytes", last)), std::string::npos) << m;
    EXPECT_NE(m.find("512"), std::string::npos) << m;
  }
  EXPECT_THROW(heap.allocate(world.rank() == 0 ? "c" : "d", 64), Error);
  heap.barrier();
}

}  // namespace expar::testing
