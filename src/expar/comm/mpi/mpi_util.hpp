#pragma once
// Small helpers of the MPI backend: errors as expar::Error, waits with a timeout, int-sized counts.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "expar/comm/mpi/mpi_c.hpp"

namespace expar::mpi {

// Throws expar::Error "<what>: <MPI's error string>" when rc is not MPI_SUCCESS (handles use
// MPI_ERRORS_RETURN, so failures surface here instead of aborting inside MPI).
void check(int rc, const char* what);
// MPI counts are int: throws expar::Error naming `op` when `bytes` does not fit.
int to_int(size_t bytes, const char* op);
// Completes `request`, polling so that a wait can end: after `timeout_seconds` it throws expar::Error naming
// the operation and the group (MPI cannot tell which ranks are missing; their own messages say where they
// are).
void wait(MPI_Request& request, const char* op, const std::string& group, double timeout_seconds);
// True when MPI_Init ran and MPI_Finalize has not.
bool active();
// Prints to stderr and flushes it on the way out of a process that is going down. It never throws:
// fmt::print throws when stderr cannot be written (or memory is gone), and the exit or abort that follows
// must still happen.
template <typename... T>
void print_last_words(fmt::format_string<T...> format, T&&... args) noexcept {
  try {
    fmt::print(stderr, format, std::forward<T>(args)...);
    std::fflush(stderr);
  } catch (...) {
  }
}

// A blocking MPI call that has no non-blocking form (communicator and window creation, MPI_Finalize) runs
// inside one of these: if it has not returned after `timeout_seconds` (a peer stopped or gone), a watchdog
// thread prints "<op> on group '<group>' ... timed out" with this process's world rank and ends the process
// with status 1, which makes mpirun end the whole job. An exception cannot be thrown from inside MPI.
class BlockingDeadline {
 public:
  BlockingDeadline(const char* op, const std::string& group, double timeout_seconds);
  ~BlockingDeadline();
  BlockingDeadline(const BlockingDeadline&) = delete;
  BlockingDeadline& operator=(const BlockingDeadline&) = delete;

 private:
  uint64_t id_;
};

// True while an exception is unwinding the stack: destructors of MPI objects then skip their collective
// teardown (MPI_Win_free, MPI_Comm_free), which would wait for peers that are not coming; the launcher
// prints the error and calls MPI_Abort, which ends every rank.
bool unwinding();

}  // namespace expar::mpi
