#pragma once
// The hand-off between the step loop (Runtime, on the scheduler's side) and the rank threads of this
// process: the loop publishes one plan at a time and waits until every local rank ran it; the ranks wait
// for the next plan. With `--transport threads` every rank is local; with `--transport mpi` the only local
// rank is world rank 0, which relays the plan to the other processes (serve/mpi_steps.hpp).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "expar/serve/expert_rebalancer.hpp"
#include "expar/serve/metrics.hpp"
#include "expar/serve/scheduler.hpp"
#include "expar/serve/step_wire.hpp"

namespace expar::serve {

class StepBoard {
 public:
  StepBoard(int local_ranks, int replicas) : local_ranks_(local_ranks), replicas_(replicas) {}

  // Rank side.
  void loaded(int64_t kv_bytes_per_token);
  enum class Next { Step, Done, Idle };
  // Waits for a plan newer than `seen` (then updates it): Step with `plan` set, Done once finish() or fail()
  // was called, Idle when `idle_after` passed without either.
  Next wait_next(uint64_t& seen, const StepPlan*& plan,
                 std::optional<std::chrono::duration<double>> idle_after = std::nullopt);
  // What world rank `rank` produced: its routing load goes to /metrics and into the step's StepLoad, and a
  // replica's sampled tokens (from its TP rank 0) to the step loop.
  void deliver(int rank, RankResult result, Metrics& metrics);
  // This rank ran the current plan.
  void arrive();
  // The first failure wins; every wait ends.
  void fail(const std::string& message);

  // Step-loop side. wait_loaded: false when a rank failed first.
  bool wait_loaded();
  int64_t kv_bytes_per_token() const;
  // Publishes `plan` and waits for every local rank; false when a rank failed (see failure()). `load`: what
  // the ranks counted in the step.
  bool run(const StepPlan& plan, StepTokens& tokens, StepLoad& load);
  // No more steps: the ranks' wait_next returns Done.
  void finish();
  std::string failure() const;

 private:
  const int local_ranks_, replicas_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int loaded_ = 0, arrived_ = 0;
  int64_t kv_bytes_per_token_ = 0;  // the largest over ranks
  uint64_t generation_ = 0;         // one per published step
  const StepPlan* plan_ = nullptr;
  StepTokens tokens_;
  StepLoad load_;
  bool done_ = false;
  std::string failure_;
};

}  // namespace expar::serve
