#pragma once
// The serving runtime: TP x DP ranks (threads of this process) each holding an inference engine, and a
// step loop that takes each StepPlan from the scheduler to every rank, runs it, and hands the tokens that
// TP rank 0 of each replica sampled back to the scheduler. Ranks stay out of collectives between steps, so
// an idle server never trips the communication timeout.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "expar/infer/generate.hpp"
#include "expar/serve/metrics.hpp"
#include "expar/serve/scheduler.hpp"

namespace expar::serve {

struct RuntimeOptions {
  std::string path;              // checkpoint directory or file (infer::open_model_spec)
  infer::GenerateOptions model;  // layout (tp, dp, EP, placement), format, decode_moe, threads per rank
  bool batch_invariant = true;   // batch-independent matmuls (core/matmul.hpp); costs speed at small batches
  int64_t kv_cache_mb = 256;     // KV cache per rank
  SchedulerOptions scheduler;
};

class Runtime {
 public:
  // Loads the model on every rank; returns once all are ready. Throws expar::Error (the first rank's
  // message) if loading fails.
  explicit Runtime(RuntimeOptions options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Scheduler& scheduler() { return *scheduler_; }
  Metrics& metrics() { return metrics_; }
  const infer::ModelSpec& spec() const { return spec_; }
  const InferenceLayout& layout() const { return *layout_; }
  // Stops taking requests, finishes (or cancels) the in-flight ones and ends the rank threads.
  void shutdown(bool cancel_in_flight);
  // The ranks' failure message, empty while they are healthy.
  std::string failure() const;

 private:
  struct Board;
  void rank_main(Comm& world);
  bool prefill_phase(const StepPlan& plan) const;  // the engine phase every rank runs `plan` in
  void step_loop();

  RuntimeOptions options_;
  infer::ModelSpec spec_;
  std::unique_ptr<InferenceLayout> layout_;
  Metrics metrics_;
  std::unique_ptr<Board> board_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread ranks_, stepper_;
};

}  // namespace expar::serve
