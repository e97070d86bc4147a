#pragma once
// Small helpers of the MPI backend: errors as expar::Error, waits with a timeout, int-sized counts.
#include <cstddef>
#include <string>

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

}  // namespace expar::mpi
