#pragma once
// One serving rank: loads its share of the model into an inference engine, then runs the steps a
// StepChannel hands it (adds and removes sequences, prefill or decode of the plan's tokens, sampling on TP
// rank 0 of each replica) until the channel says there are no more. The same loop runs on the rank threads
// of `--transport threads` and in every process of `--transport mpi`; only the channel differs.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/infer/generate.hpp"
#include "expar/serve/step_wire.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::serve {

struct RuntimeOptions;

// How a rank receives its steps and returns what it produced.
class StepChannel {
 public:
  virtual ~StepChannel() = default;
  // The rank loaded its weights; `kv_bytes_per_token`: its KV-cache bytes per token position.
  virtual void loaded(int64_t kv_bytes_per_token) = 0;
  // Blocks until the next step; nullptr: no more steps, the rank returns.
  virtual const StepPlan* next() = 0;
  // The rank ran the step next() returned.
  virtual void finished(RankResult result) = 0;
};

// The checkpoint and the layout of a serving job, the same on every rank.
struct ServingModel {
  infer::ModelSpec spec;
  InferenceLayout layout;
};
// The KV positions every rank can hold: --kv-cache-mb over the largest bytes one position takes on any rank
// (the scheduler gives every replica the same positions: runtime.cpp).
int64_t largest_kv_bytes_per_token(const infer::ModelSpec& spec, const InferenceLayout& layout);
int64_t kv_tokens_per_rank(const RuntimeOptions& options, const infer::ModelSpec& spec,
                           const InferenceLayout& layout);
// Checks the options (expar::Error naming the flag), reads the checkpoint's configuration and refuses a model
// whose ranks on this process (every rank; under MPI, `mpi_world`'s rank) do not fit in its memory, before
// anything is loaded (infer/rank_memory_plan.hpp: each rank's KV cache is its --kv-cache-mb).
ServingModel open_serving_model(const RuntimeOptions& options, const Comm* mpi_world = nullptr);

void run_serving_rank(const RuntimeOptions& options, const ServingModel& model, Comm& world,
                      StepChannel& channel);

}  // namespace expar::serve
