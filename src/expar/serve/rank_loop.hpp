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
// Checks the options (expar::Error naming the flag) and reads the checkpoint's configuration.
ServingModel open_serving_model(const RuntimeOptions& options);

void run_serving_rank(const RuntimeOptions& options, const ServingModel& model, Comm& world,
                      StepChannel& channel);

}  // namespace expar::serve
