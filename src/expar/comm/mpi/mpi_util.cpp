#include "expar/comm/mpi/mpi_util.hpp"

#include <sched.h>

#include <chrono>
#include <climits>

#include "expar/core/error.hpp"

namespace expar::mpi {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail("{}: MPI error: {}", what, std::string(text, static_cast<size_t>(length)));
}

int to_int(size_t bytes, const char* op) {
  EXPAR_CHECK(bytes <= static_cast<size_t>(INT_MAX),
              "{}: {} bytes exceed MPI's int count limit ({}); split the transfer into smaller pieces", op,
              bytes, INT_MAX);
  return static_cast<int>(bytes);
}

void wait(MPI_Request& request, const char* op, const std::string& group, double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline)
      fail(
          "{} on group '{}' timed out after {} s: some members did not arrive (MPI cannot tell which; their "
          "own "
          "messages say where they are); raise EXPAR_COMM_TIMEOUT if they are just slow",
          op, group, timeout_seconds);
    sched_yield();  // ranks may outnumber cores
  }
}

bool active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace expar::mpi
