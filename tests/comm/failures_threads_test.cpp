// The threads launcher's failure behaviour: a rank that throws ends the run with its message, nothing hangs.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The message of the error that a run of `ranks` ranks, whose waits time out after `timeout_seconds`, ends
// with.
std::string message_of_run(int ranks, double timeout_seconds, const std::function<void(Comm&)>& fn) {
  LaunchOptions options;
  options.ranks = ranks;
  options.timeout_seconds = timeout_seconds;
  return message_of([&] { run_ranks(options, fn); });
}

TEST(Failures, ThrowingRankEndsTheRunWithItsMessage) {
  for (int thrower = 0; thrower < 4; ++thrower) {
    auto m = message_of([&] {
      run_ranks(4, [&](Comm& world) {
        auto sub = world.subgroup({{0, 1}, {2, 3}}, "pair");
        if (world.rank() == thrower) throw Error("boom from the test");
        // The others block in collectives the thrower never joins; they must be woken, not hang.
        sub->barrier();
        world.barrier();
      });
    });
    EXPECT_EQ(m, "rank " + std::to_string(thrower) + ": boom from the test");
  }
}

TEST(Failures, ThrowingRankWakesSignalWaiters) {
  auto m = message_of([] {
    run_ranks(2, [](Comm& world) {
      auto heap = world.make_heap();
      if (world.rank() == 1) throw std::runtime_error("plain std exception");
      heap->wait_signal(0, 1);
    });
  });
  EXPECT_EQ(m, "rank 1: plain std exception");
}

TEST(Failures, RankThatReturnsEarlyIsReportedNotWaitedFor) {
  auto m = message_of([] {
    run_ranks(3, [](Comm& world) {
      if (world.rank() == 1) return;
      world.barrier();
    });
  });
  EXPECT_NE(m.find("barrier on group 'world'"), std::string::npos) << m;
  EXPECT_NE(m.find("never arrived"), std::string::npos) << m;
}

TEST(Failures, TimeoutNamesOperationGroupAndMissingRanks) {
  // Generous margins: on a loaded 2-core machine rank 1 must reach the all_gather within the timeout, or it
  // is (rightly) reported as missing too.
  auto m = message_of_run(3, 1.5, [](Comm& world) {
    if (world.rank() == 2) std::this_thread::sleep_for(std::chrono::seconds(4));
    std::vector<float> x(4);
    world.all_gather(x.data(), std::vector<float>(12).data(), 4, DType::F32);
  });
  EXPECT_NE(m.find("all_gather on group 'world' timed out"), std::string::npos) << m;
  // Ranks 0 and 1 both time out waiting for rank 2. Usually the first to give up reports "[2]"; but the one
  // that gives up first withdraws its arrival as it unwinds, so if the other records its timeout first it
  // rightly reports that rank as gone too ("[0, 2]" from rank 1, "[1, 2]" from rank 0). Rank 2 is always
  // named, and a rank never names itself.
  const bool from_rank0 = m.rfind("rank 0:", 0) == 0, from_rank1 = m.rfind("rank 1:", 0) == 0;
  ASSERT_TRUE(from_rank0 || from_rank1) << m;
  const std::string alone = "group ranks [2] (world ranks [2])";
  const std::string with_peer =
      from_rank0 ? "group ranks [1, 2] (world ranks [1, 2])" : "group ranks [0, 2] (world ranks [0, 2])";
  EXPECT_TRUE(m.find(alone) != std::string::npos || m.find(with_peer) != std::string::npos) << m;
}

TEST(Failures, SignalWaitTimesOut) {
  auto m = message_of_run(2, 0.2, [](Comm& world) {
    auto heap = world.make_heap();
    if (world.rank() == 0) heap->wait_signal(5, 1);
    // Rank 1 arrives late at the barrier so that rank 0's signal wait is the first to time out.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    heap->barrier();
  });
  EXPECT_NE(m.find("wait_signal(slot 5, value 1)"), std::string::npos) << m;
}

TEST(Failures, BadOptionsAreRejected) {
  EXPECT_THROW(run_ranks(0, [](Comm&) {}), Error);
  LaunchOptions options;
  options.compute_threads = 0;
  EXPECT_THROW(run_ranks(options, [](Comm&) {}), Error);
}

TEST(Failures, TimeoutFromTheEnvironmentMustBeFiniteAndPositive) {
  for (const char* bad : {"inf", "nan", "0", "-3", "1e300", "soon"}) {
    setenv("EXPAR_COMM_TIMEOUT", bad, 1);
    const std::string m = message_of([] { run_ranks(2, [](Comm& world) { world.barrier(); }); });
    EXPECT_NE(m.find(std::string("EXPAR_COMM_TIMEOUT='") + bad + "' is not a finite positive number"),
              std::string::npos)
        << m;
  }
  setenv("EXPAR_COMM_TIMEOUT", "30", 1);
  EXPECT_EQ(message_of([] { run_ranks(2, [](Comm& world) { world.barrier(); }); }), "(no error)");
  unsetenv("EXPAR_COMM_TIMEOUT");
}

TEST(Failures, ComputeThreadsAreBounded) {
  LaunchOptions options;
  options.compute_threads = 100000;
  EXPECT_NE(message_of([&] { run_ranks(options, [](Comm&) {}); }).find("use 1 to 1024 compute threads"),
            std::string::npos);
}

// Every rank's thread runs its kernels with the requested number of OpenMP threads: a count other than the
// test thread's own, so that a launcher that forgot to set it is caught.
TEST(Failures, ComputeThreadsAreSetPerRank) {
  const int wanted = compute_threads() == 3 ? 5 : 3;
  LaunchOptions options;
  options.ranks = 2;
  options.compute_threads = wanted;
  std::mutex mutex;
  std::vector<int> seen(2, 0);
  run_ranks(options, [&](Comm& world) {
    const int mine = compute_threads();
    world.barrier();
    std::lock_guard lock(mutex);
    seen[static_cast<size_t>(world.rank())] = mine;
  });
  EXPECT_EQ(seen, std::vector<int>(2, wanted));
}

}  // namespace
}  // namespace expar
