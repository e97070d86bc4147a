#pragma once
// Continuous batching over DP replicas (seed 002's cross-DP EP server). Each replica has its own queue and
// running set; every step, each replica's running requests decode one token, requests in prefill continue
// with their next prompt chunk, and waiting requests join while the step's token budget, the replica's KV
// budget and its sequence limit allow. All replicas step together (their MoE layers exchange tokens): the
// step's phase is prefill when any replica has a prompt chunk, and a replica with nothing to do runs a
// zero-token dummy step (seed 002's DP padding).
//
// Batch invariance: a prompt is always cut at multiples of `prefill_chunk` whatever else runs, the sampled
// token depends only on (logits, parameters, seed, index) and the engine runs with batch-independent
// matmuls (core/matmul.hpp), so a request's tokens do not depend on its neighbours.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "expar/serve/metrics.hpp"
#include "expar/serve/request_state.hpp"
#include "expar/topo/placement.hpp"

namespace expar::serve {

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // tokens per replica per step: decode tokens + prompt chunks
  int64_t prefill_chunk = 256;     // prompts run in chunks of this many tokens (the last may be shorter)
  int64_t max_running = 64;        // sequences per replica
  int64_t max_waiting = 1024;      // queued requests over all replicas; beyond: 503
  // Throws expar::Error naming the option when a value is out of range.
  void validate() const;
};

struct SequenceStep {
  int64_t slot = 0;             // the scheduler's sequence slot (ranks map it to engine sequence ids)
  std::vector<int32_t> tokens;  // the prompt chunk, or the one token to decode
  bool sample = false;          // the logits of the last row give the request's next token
  infer::SamplingParams sampling;
  uint64_t seed = 0, index = 0;  // the sampling stream and the token's index in it
  bool trace_logits = false;     // also return a hash of the sampled logits row
  // A prompt chunk (not the decode of a generated token): the last chunk samples the first token.
  bool prompt_chunk() const { return !sample || index == 0; }
};

struct ReplicaStep {
  std::vector<std::pair<int64_t, int64_t>> add;  // (slot, capacity): add_sequence before the step
  std::vector<int64_t> remove;                   // slots to remove_sequence before the step
  std::vector<SequenceStep> sequences;           // empty: a dummy step
};

struct StepPlan {
  bool prefill = false;               // engine phase for every replica
  bool runs_engine = false;           // false: only adds/removes (no replica has tokens)
  std::vector<ReplicaStep> replicas;  // index = DP rank
  // Non-empty: before this step every rank moves the experts of each listed MoE layer to its slot table
  // (serve/expert_rebalancer.hpp, infer::Engine::move_experts); the other layers keep theirs.
  std::vector<LayerSlotTable> expert_tables;
};

// Per replica, the sampled tokens of its `sample` sequences, in plan order (and, for sequences that trace
// their logits, a hash of each sampled row, in the same order).
struct ReplicaTokens {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> logits_hashes;
};
using StepTokens = std::vector<ReplicaTokens>;

class Scheduler {
 public:
  // kv_tokens: KV-cache positions each replica can hold (--kv-cache-mb / bytes per token); max_seq: the
  // model's context.
  Scheduler(SchedulerOptions options, int replicas, int64_t kv_tokens, int64_t max_seq, Metrics& metrics);

  // Queues a request on the least loaded replica. Throws ApiError 400 if it can never run (prompt empty or
  // beyond the context, more KV than a replica has) and 503 when the queue is full or the server stops.
  std::shared_ptr<RequestState> submit(GenerationRequest request);

  // Blocks until there is work, then returns the next step; nullopt once stopped and drained.
  std::optional<StepPlan> next_step();
  // The tokens the ranks sampled for `plan` (from next_step).
  void complete_step(const StepPlan& plan, const StepTokens& tokens);
  // No new requests; next_step returns nullopt once the in-flight ones finished (cancel: finish them now).
  void stop(bool cancel_in_flight);
  // The ranks failed: every request ends with `message`; next_step returns nullopt.
  void fail(const std::string& message);

  int64_t kv_tokens() const { return kv_tokens_; }
  int64_t max_seq() const { return max_seq_; }

 private:
  struct Running {
    std::shared_ptr<RequestState> state;
    int64_t slot = 0, capacity = 0, prefilled = 0;
  };
  struct Replica {
    std::deque<std::shared_ptr<RequestState>> waiting;
    std::vector<Running> running;
    std::vector<int64_t> pending_remove;
    int64_t kv_reserved = 0, kv_waiting = 0;
  };
  bool has_work_locked() const;
  void drop_cancelled_locked(Replica& r);
  ReplicaStep plan_replica_locked(Replica& r);
  void release_locked(Replica& r, size_t running_index);
  void update_gauges_locked();

  SchedulerOptions options_;
  int64_t kv_tokens_, max_seq_;
  Metrics& metrics_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::vector<Replica> replicas_;
  int64_t next_slot_ = 0;
  size_t waiting_total_ = 0;
  bool stopping_ = false, failed_ = false;
};

}  // namespace expar::serve
