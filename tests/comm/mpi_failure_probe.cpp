// A small MPI program for tests/comm/mpi_failures_test.cpp: one rank fails in a chosen way while its peers
// are inside collectives, so the test can check how (and how fast) the job ends.
//   mpi_failure_probe ok          every rank makes a heap, meets the others and exits 0
//   mpi_failure_probe throw R     rank R throws after the heap exists; the others keep meeting
//   mpi_failure_probe stop R      rank R stops itself (SIGSTOP) after the heap exists
//   mpi_failure_probe stop-setup R  rank R stops itself before the heap is made (peers are in MPI_Comm_dup)
//   mpi_failure_probe kill R      rank R dies (SIGKILL) after 20 rounds of heap traffic with every peer
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int victim = argc > 2 ? std::atoi(argv[2]) : 0;
  expar::LaunchOptions options;
  options.timeout_seconds = 60;  // EXPAR_COMM_TIMEOUT overrides it
  return expar::run_mpi(&argc, &argv, options, [&](expar::Comm& world) {
    if (mode == "stop-setup" && world.rank() == victim) raise(SIGSTOP);
    auto heap = world.make_heap();
    heap->allocate("probe", 64);
    if (mode == "ok") {
      heap->barrier();
      world.barrier();
      return;
    }
    if (world.rank() == victim) {
      if (mode == "throw") expar::fail("probe: rank {} failed on purpose", victim);
      if (mode == "stop") raise(SIGSTOP);
    }
    for (int round = 0;; ++round) {
      if (mode == "kill" && round == 20 && world.rank() == victim) raise(SIGKILL);
      // A put to every peer each round (across nodes too, under scripts/mpirun-nodes), as a step would.
      const char byte = static_cast<char>(round);
      for (int peer = 0; peer < world.size(); ++peer)
        heap->put(peer, 0, static_cast<size_t>(world.rank()), &byte, 1);
      heap->barrier();
      world.barrier();
    }
  });
}
