#pragma once
// The serving runtime: TP x DP ranks each holding an inference engine (serve/rank_loop.hpp), and a step
// loop that takes each StepPlan from the scheduler to every rank, runs it, and hands the tokens that TP
// rank 0 of each replica sampled back to the scheduler. The ranks are threads of this process, or (MPI)
// processes of which this one is world rank 0 (serve/mpi_steps.hpp). Ranks stay out of collectives
// between steps (MPI: but for rank 0's idle messages), so an idle server never trips the communication
// timeout.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "expar/infer/generate.hpp"
#include "expar/serve/expert_rebalancer.hpp"
#include "expar/serve/metrics.hpp"
#include "expar/serve/rank_loop.hpp"
#include "expar/serve/scheduler.hpp"

namespace expar::serve {

class StepBoard;

struct RuntimeOptions {
  std::string path;              // checkpoint directory or file (infer::open_model_spec)
  infer::GenerateOptions model;  // layout (tp, dp, EP, placement), format, decode_moe, threads per rank
  bool batch_invariant = true;   // batch-independent matmuls (core/matmul.hpp); costs speed at small batches
  int64_t kv_cache_mb = 256;     // KV cache per rank
  SchedulerOptions scheduler;
  // With EP: the window of the imbalance on /metrics and, with an interval, rebalancing while running
  // (serve/expert_rebalancer.hpp).
  EplbOptions eplb;
};

class Runtime {
 public:
  // Loads the model on every rank (threads of this process); returns once all are ready. Throws
  // expar::Error (the first rank's message) if loading fails.
  explicit Runtime(RuntimeOptions options);
  // MPI: this process is world rank 0 of `world` (one process per rank; the others run
  // run_mpi_follower). Its own rank runs on a thread; a failure there ends the whole job with the
  // rank's message (abort_mpi_job), as a failure in any other process does.
  Runtime(RuntimeOptions options, Comm& world);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Scheduler& scheduler() { return *scheduler_; }
  Metrics& metrics() { return metrics_; }
  const infer::ModelSpec& spec() const { return model_.spec; }
  const InferenceLayout& layout() const { return model_.layout; }
  // Stops taking requests, finishes (or cancels) the in-flight ones and ends the ranks.
  void shutdown(bool cancel_in_flight);
  // The ranks' failure message, empty while they are healthy.
  std::string failure() const;

 private:
  Runtime(RuntimeOptions options, Comm* mpi_world);
  void step_loop();

  RuntimeOptions options_;
  ServingModel model_;
  Metrics metrics_;
  std::unique_ptr<StepBoard> board_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ExpertRebalancer> rebalancer_;  // EP layouts
  std::thread ranks_, stepper_;
};

}  // namespace expar::serve
