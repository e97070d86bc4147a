#pragma once
// <mpi.h> without Open MPI's deprecated C++ bindings: expar links only the C library (MPI::MPI_C).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
