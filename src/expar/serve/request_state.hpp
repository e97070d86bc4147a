#pragma once
// One generation request as the scheduler and the HTTP handler share it: what to generate, and the tokens
// generated so far, published under a mutex with a condition variable the handler waits on.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "expar/infer/sampling.hpp"

namespace expar::serve {

using Clock = std::chrono::steady_clock;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;              // sampled tokens at most
  infer::SamplingParams sampling;       // temperature 0: greedy
  uint64_t seed = 0;                    // the sampling stream (the client's seed, or a random one)
  std::vector<int32_t> stop_token_ids;  // end the request when one is sampled (it is not returned)
  bool trace_logits = false;            // keep a hash of the logits row behind every token (tests)
};

enum class FinishReason : uint8_t { None, Length, Stop, Cancelled, Error };
const char* finish_reason_name(FinishReason reason);  // OpenAI's "length" | "stop"; "cancelled"; "error"

class RequestState {
 public:
  explicit RequestState(GenerationRequest request) : request_(std::move(request)) {}
  const GenerationRequest& request() const { return request_; }

  // Handler side: waits until more than `seen` tokens exist or the request finished; returns the tokens
  // from `seen` on (empty when finished with nothing new).
  std::vector<int32_t> wait_tokens(size_t seen);
  bool finished() const;
  FinishReason finish_reason() const;
  std::string error() const;
  // The handler no longer wants tokens (client gone, stop string found): the scheduler drops the request
  // and frees its cache at the next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Scheduler side.
  void push_token(int32_t token);
  void finish(FinishReason reason, std::string error = {});
  size_t generated() const;
  int32_t last_token() const;
  void push_logits_hash(uint64_t hash);
  std::vector<uint64_t> logits_hashes() const;  // with trace_logits: one per sampled row, in order

  const Clock::time_point arrived = Clock::now();
  std::optional<Clock::time_point> first_token_at;  // scheduler thread only
  Clock::time_point last_token_at;                  // scheduler thread only

 private:
  GenerationRequest request_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> logits_hashes_;
  FinishReason reason_ = FinishReason::None;
  std::string error_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace expar::serve
