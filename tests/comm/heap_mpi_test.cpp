// SymmetricHeap of the MPI backend, both kinds in every run: the shared-memory window (Auto) and the
// across-node path (ForceRemote: MPI_Win_allocate + MPI_Put/MPI_Get, as EXPAR_MPI_FORCE_REMOTE=1 selects).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "comm/comm_test_data.hpp"
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
  auto& world = mpi_world();
  const int n = world.size(), me = world.rank();
  constexpr size_t kCount = 37;
  constexpr float kPoison = -1234.5f;
  auto heap = make();
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
    EXPECT_TRUE(std::equal(want.begin(), want.end(), mine + static_cast<size_t>(s) * kCount)) << "from " << s;
  }
  EXPECT_EQ(mine[elems - 1], kPoison);
  for (int peer = 0; peer < n; ++peer) {
    std::vector<float> back(kCount + 1, kPoison);
    heap->get(peer, buf, static_cast<size_t>(me) * kCount * sizeof(float), back.data(),
              kCount * sizeof(float));
    heap->quiet();
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), back.begin()));
    EXPECT_EQ(back.back(), kPoison);
    EXPECT_EQ(heap->peer_ptr(peer, buf) == nullptr, remote()) << "peer " << peer;
  }
  heap->barrier();
}

TEST_P(MpiHeapTest, ManyRowPutsAtRandomOffsetsLandExactly) {
  auto& world = mpi_world();
  const int n = world.size(), me = world.rank();
  constexpr size_t kRowBytes = 1000;
  constexpr size_t kRowsPerSource = 24;
  auto heap = make();
  BufferId buf = heap->allocate("rows", kRowBytes * kRowsPerSource * static_cast<size_t>(n));
  auto perm_of = [&](int s) {
    std::vector<size_t> p(kRowsPerSource);
    std::iota(p.begin(), p.end(), size_t{0});
    for (size_t i = kRowsPerSource - 1; i > 0; --i)
      std::swap(p[i], p[random_u32(kSeed, 77 + static_cast<uint64_t>(s), i) % (i + 1)]);
    return p;
  };
  auto perm = perm_of(me);
  // Rows must stay unchanged until quiet(): MPI_Put may read them late.
  std::vector<std::vector<uint8_t>> rows;
  for (size_t j = 0; j < kRowsPerSource; ++j)
    rows.push_back(values_of<uint8_t>(me, kRowBytes, 60, j * kRowBytes));
  for (size_t j = 0; j < kRowsPerSource; ++j)
    for (int k = 0; k < n; ++k)
      heap->put((me + k) % n, buf, (static_cast<size_t>(me) * kRowsPerSource + perm[j]) * kRowBytes,
                rows[j].data(), kRowBytes);
  heap->barrier();
  auto* mine = static_cast<uint8_t*>(heap->local(buf));
  for (int s = 0; s < n; ++s) {
    auto p = perm_of(s);
    for (size_t j = 0; j < kRowsPerSource; ++j) {
      auto want = values_of<uint8_t>(s, kRowBytes, 60, j * kRowBytes);
      EXPECT_EQ(0, std::memcmp(mine + (static_cast<size_t>(s) * kRowsPerSource + p[j]) * kRowBytes,
                               want.data(), kRowBytes))
          << "row " << j << " from " << s;
    }
  }
  heap->barrier();
}

TEST_P(MpiHeapTest, SignalsOrderPutsBeforeTheWake) {
  auto& world = mpi_world();
  const int n = world.size(), me = world.rank();
  auto heap = make();
  BufferId buf = heap->allocate("ring", 64 * sizeof(int64_t));
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (uint64_t round = 1; round <= 20; ++round) {
    auto payload = values_of<int64_t>(me, 64, 70 + round);
    heap->put(next, buf, 0, payload.data(), 64 * sizeof(int64_t));
    heap->signal(next, 3, round);
    heap->wait_signal(3, round);
    auto want = values_of<int64_t>(prev, 64, 70 + round);
    EXPECT_EQ(0, std::memcmp(heap->local(buf), want.data(), 64 * sizeof(int64_t))) << "round " << round;
    heap->barrier();
  }
}

TEST_P(MpiHeapTest, AllocationMismatchIsReportedOnEveryMember) {
  auto& world = mpi_world();
  auto heap = make();
  heap->allocate("a", 128);
  const int last = world.size() - 1;
  const size_t bytes = world.rank() == last ? 256 : 512;
  try {
    heap->allocate("b", bytes);
    ADD_FAILURE() << "rank " << world.rank() << " did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("rank {} allocates 'b' of 256 bytes", last)), std::string::npos) << m;
    EXPECT_NE(m.find("512"), std::string::npos) << m;
  }
  heap->barrier();
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
