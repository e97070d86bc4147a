#pragma once
// `expar serve --transport mpi`: one process per rank under mpirun. World rank 0 runs the HTTP front end,
// the scheduler and its own engine rank; the others follow. Every step, rank 0 broadcasts the plan (each
// replica's sequences and tokens, dummy steps included, adds, removes) and gathers what each rank sampled,
// so every process runs exactly the engine steps the threads transport runs.
//
// Messages from rank 0: a header {kind, length}, then for a step the plan (step_wire.hpp). While the
// server is idle rank 0 sends an Idle header every `idle_seconds` (at most a quarter of the comm timeout),
// so the followers' waits never reach the communication timeout; Done ends them.
#include <memory>

#include "expar/serve/metrics.hpp"
#include "expar/serve/rank_loop.hpp"
#include "expar/serve/step_board.hpp"

namespace expar::serve {

// Throws expar::Error when the MPI world does not hold one process per rank of the layout.
void check_mpi_world(const InferenceLayout& layout, const Comm& world);
// Rank 0's channel: takes plans from the board, relays them, delivers every rank's results to it.
std::unique_ptr<StepChannel> mpi_root_channel(StepBoard& board, Metrics& metrics, Comm& world);
// A follower (world rank > 0): loads its rank and runs rank 0's steps until Done.
void run_mpi_follower(const RuntimeOptions& options, Comm& world);

}  // namespace expar::serve
