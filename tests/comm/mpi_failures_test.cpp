// How an MPI job ends when one rank fails (contract 6 of docs/design.md: a rank that fails takes its peers
// down with its message; nothing hangs forever). Each case runs tests/comm/mpi_failure_probe under
// scripts/mpirun-local, or across emulated nodes under scripts/mpirun-nodes.
// The elapsed bounds are the property under test (a timeout that ends the job), kept generous.
#include <gtest/gtest.h>

#include <string>

#include "run_process.hpp"

namespace expar {
namespace {

using testing::ProcessResult;
using testing::run_process;

ProcessResult run_probe(int ranks, const std::string& mode, int victim, const std::string& timeout) {
  return run_process({EXPAR_MPIRUN_LOCAL, "-n", std::to_string(ranks), EXPAR_MPI_FAILURE_PROBE, mode,
                      std::to_string(victim)},
                     {{"EXPAR_COMM_TIMEOUT", timeout}}, /*limit_seconds=*/120);
}

TEST(MpiFailures, HealthyJobExitsZero) {
  ProcessResult r = run_probe(2, "ok", 0, "60");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.killed_at_limit);
}

// The thrower's own teardown used to wait in MPI_Win_free (collective) for peers that never came, and the
// peers noticed only after the whole timeout: the job must end at once, with the thrower's message.
TEST(MpiFailures, OneRankErrorEndsTheJobFastWithItsMessage) {
  for (int victim : {0, 1}) {
    ProcessResult r = run_probe(3, "throw", victim, "60");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_FALSE(r.killed_at_limit) << r.output;
    EXPECT_LT(r.seconds, 10.0) << r.output;
    EXPECT_NE(r.output.find("rank " + std::to_string(victim) + ": error: probe: rank " +
                            std::to_string(victim) + " failed on purpose"),
              std::string::npos)
        << r.output;
  }
}

// A stopped peer: the others' waits time out, and their error path must not block in a collective teardown.
TEST(MpiFailures, StoppedRankEndsTheJobWithinTheTimeout) {
  ProcessResult r = run_probe(2, "stop", 1, "3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_LT(r.seconds, 3.0 + 20.0) << r.output;
  EXPECT_NE(r.output.find("timed out after 3 s"), std::string::npos) << r.output;
}

// Stopped before the heap exists: its peers are inside MPI_Comm_dup, a blocking call with no timeout of its
// own; the watchdog ends them.
TEST(MpiFailures, StoppedRankDuringSetupEndsTheJobWithinTheTimeout) {
  ProcessResult r = run_probe(2, "stop-setup", 1, "3");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_LT(r.seconds, 3.0 + 20.0) << r.output;
  EXPECT_NE(r.output.find("symmetric heap creation on group 'world.heap' timed out after 3 s"),
            std::string::npos)
      << r.output;
}

// A node that dies: ranks 0, 1 on emulated node 0 and 2, 3 on node 1 (scripts/mpirun-nodes 2 2, TCP between
// the nodes), exchanging puts with every peer each round. Skipped where network namespaces cannot be made.
ProcessResult run_probe_on_nodes(const std::string& mode, int victim, const std::string& timeout) {
  return run_process({EXPAR_MPIRUN_NODES, "2", "2", EXPAR_MPI_FAILURE_PROBE, mode, std::to_string(victim)},
                     {{"EXPAR_COMM_TIMEOUT", timeout}}, /*limit_seconds=*/120);
}

// Killed mid-step (SIGKILL: the rank cannot say anything): its node's Open MPI daemon sees the death and the
// job ends on the other node at once, with mpirun's message naming the rank and the signal.
TEST(MpiFailuresAcrossNodes, KilledRankOfOneNodeEndsTheJobOnTheOtherNode) {
  ProcessResult r = run_probe_on_nodes("kill", 3, "60");
  if (r.exit_code == 77) GTEST_SKIP() << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("rank 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

// A rank of node 1 that stops answering mid-step (SIGSTOP: its daemon sees nothing): the ranks of node 0 end
// the job with their timeout message.
TEST(MpiFailuresAcrossNodes, StoppedRankOfOneNodeEndsTheJobOnTheOtherNodeWithinTheTimeout) {
  ProcessResult r = run_probe_on_nodes("stop", 2, "3");
  if (r.exit_code == 77) GTEST_SKIP() << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_LT(r.seconds, 3.0 + 20.0) << r.output;
  EXPECT_TRUE(r.output.find("expar: rank 0: error:") != std::string::npos ||
              r.output.find("expar: rank 1: error:") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("timed out after 3 s"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace expar
