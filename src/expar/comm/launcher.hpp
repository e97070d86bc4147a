#pragma once
// Starting ranks. One launcher shared by the CLI and the tests.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/memory.hpp"

namespace expar {

// Bounds of LaunchOptions (more would only fail later, creating threads or memory, without a message).
inline constexpr int kMaxLaunchRanks = 4096;
inline constexpr int kMaxComputeThreads = 1024;

struct LaunchOptions {
  int ranks = 1;
  int compute_threads = 1;         // oneDNN/OpenMP threads per rank
  double timeout_seconds = 300.0;  // every wait ends the run with a message after this long
  // Threads backend: world ranks [n*k, (n+1)*k) form emulated node n, so Comm::nodes() and the traffic
  // statistics see nodes, and a heap maps no peer of another node (its rows become put/get messages).
  // 0: every rank on one node. Must divide ranks. Ignored by run_mpi (MPI finds the real nodes).
  int ranks_per_node = 0;
};

// The transports a command's --transport chooses from: "threads" (run_ranks: ranks are threads of this
// process) and "mpi" (run_mpi: one rank per process, under mpirun).
inline std::vector<std::string> transport_names() {
  return {"threads", "mpi"};
}

// The rule of `--ranks-per-node K` wherever a command takes it: threads transport only (MPI finds the real
// nodes of its ranks), and K divides the ranks. Throws expar::Error naming the flag and the fix.
void check_emulated_nodes(int ranks_per_node, int ranks, const std::string& transport);

// Threads backend: runs fn(world) on `ranks` threads of this process, each with its own memory tracker
// bound and `compute_threads` compute threads. If any rank throws, every other rank's waits are woken with
// an error and the first error is rethrown here, prefixed with its rank.
void run_ranks(const LaunchOptions& options, const std::function<void(Comm& world)>& fn);
// Like run_ranks, and returns every rank's memory snapshot (index = world rank), taken on the rank's thread
// after fn returned: `current` is what fn left allocated, `peak` the high-water mark of the whole run. This
// is how the CLI and tests read the per-rank trackers (inside fn, a rank reads its own with
// current_tracker()). Timeouts: LaunchOptions::timeout_seconds, overridden by the environment variable
// EXPAR_COMM_TIMEOUT.
std::vector<MemorySnapshot> run_ranks_tracked(const LaunchOptions& options,
                                              const std::function<void(Comm& world)>& fn);
inline void run_ranks(int ranks, const std::function<void(Comm& world)>& fn) {
  LaunchOptions o;
  o.ranks = ranks;
  run_ranks(o, fn);
}

// MPI backend: fn(world) on this process's rank of MPI_COMM_WORLD (MPI_Init/Finalize handled here). An
// exception prints the rank's message and calls MPI_Abort so that no peer hangs.
// Environment: EXPAR_MPI_FORCE_REMOTE=1 makes the heap use MPI_Win_allocate + MPI_Put/MPI_Get even on one
// node (no shared window, no peer_ptr), the across-node code path.
int run_mpi(int* argc, char*** argv, const LaunchOptions& options,
            const std::function<void(Comm& world)>& fn);
// Prints "expar: rank R: error: <message>" and ends the whole MPI job (MPI_Abort): what run_mpi does with
// fn's exceptions, for a thread of a rank other than the one that called run_mpi.
[[noreturn]] void abort_mpi_job(const std::string& message);

}  // namespace expar
