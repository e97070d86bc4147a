#pragma once
// main() of the MPI tests: every rank runs all tests inside run_mpi, on the world Comm that tests reach with
// mpi_world(). Tests must call the same collectives on every rank, so they use EXPECT, not ASSERT, after the
// first collective. The exit status is non-zero on a rank whose tests failed, which fails the mpirun.
#include <gtest/gtest.h>

#include "expar/comm/launcher.hpp"
#include "expar/comm/mpi/mpi_comm.hpp"

namespace expar::testing {

inline mpi::MpiComm*& mpi_world_slot() {
  static mpi::MpiComm* world = nullptr;
  return world;
}
inline mpi::MpiComm& mpi_world() {
  return *mpi_world_slot();
}

inline int mpi_test_main(int argc, char** argv) {
  int result = 1;
  LaunchOptions options;
  options.timeout_seconds = 120;
  run_mpi(&argc, &argv, options, [&](Comm& world) {
    mpi_world_slot() = &dynamic_cast<mpi::MpiComm&>(world);
    ::testing::InitGoogleTest(&argc, argv);
    result = RUN_ALL_TESTS();
    mpi_world_slot() = nullptr;
  });
  return result;
}

}  // namespace expar::testing
