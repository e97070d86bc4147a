// run_mpi: the MPI backend's launcher.
#include <cstdlib>
#include <exception>

#include "expar/comm/comm_env.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/mpi/mpi_comm.hpp"
#include "expar/comm/mpi/mpi_util.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

void abort_mpi_job(const std::string& message) {
  int rank = -1;
  if (mpi::active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  mpi::print_last_words("expar: rank {}: error: {}\n", rank, message);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

int run_mpi(int* argc, char*** argv, const LaunchOptions& options,
            const std::function<void(Comm& world)>& fn) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  // Serialized: the MoE layer's overlapped wave schedule (moe/wave_schedule.hpp) calls MPI from its
  // communication thread while the rank's main thread computes (never both at once).
  int provided = 0;
  if (!initialized) MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  try {
    EXPAR_CHECK(options.compute_threads >= 1 && options.compute_threads <= kMaxComputeThreads,
                "compute_threads = {}: use 1 to {} compute threads per rank", options.compute_threads,
                kMaxComputeThreads);
    set_compute_threads(options.compute_threads);
    mpi::MpiComm world(MPI_COMM_WORLD, "world", comm_timeout_seconds(options.timeout_seconds));
    fn(world);
  } catch (const std::exception& e) {
    // Peers may be blocked in a collective this rank will never join: take the whole job down now. The
    // destructors on the way here skipped their collective teardown (mpi::unwinding()).
    abort_mpi_job(e.what());
  } catch (...) {
    abort_mpi_job("unknown exception");
  }
  if (!initialized) {
    mpi::BlockingDeadline deadline("MPI_Finalize", "world", comm_timeout_seconds(options.timeout_seconds));
    MPI_Finalize();
  }
  return 0;
}

}  // namespace expar
