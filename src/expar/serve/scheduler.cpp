#include "expar/serve/scheduler.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/serve/api_error.hpp"

namespace expar::serve {

void SchedulerOptions::validate() const {
  EXPAR_CHECK(prefill_chunk >= 1, "--prefill-chunk {} must be at least 1", prefill_chunk);
  EXPAR_CHECK(max_batch_tokens >= prefill_chunk,
              "--max-batch-tokens {} must be at least --prefill-chunk {} (a step must fit one prompt chunk)",
              max_batch_tokens, prefill_chunk);
  EXPAR_CHECK(max_running >= 1, "--max-running {} must be at least 1", max_running);
  EXPAR_CHECK(max_waiting >= 1, "--max-waiting {} must be at least 1", max_waiting);
}

Scheduler::Scheduler(SchedulerOptions options, int replicas, int64_t kv_tokens, int64_t max_seq,
                     Metrics& metrics)
    : options_(options),
      kv_tokens_(kv_tokens),
      max_seq_(max_seq),
      metrics_(metrics),
      replicas_(static_cast<size_t>(replicas)) {
  options_.validate();
  EXPAR_CHECK(replicas >= 1, "{} DP replicas: need at least one", replicas);
  EXPAR_CHECK(kv_tokens >= 1, "the KV cache holds {} tokens per replica: raise --kv-cache-mb", kv_tokens);
}

std::shared_ptr<RequestState> Scheduler::submit(GenerationRequest request) {
  const auto prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) api_fail(400, "prompt", "the prompt is empty: give at least one token");
  if (request.max_tokens < 1)
    api_fail(400, "max_tokens", "max_tokens={} must be at least 1", request.max_tokens);
  if (prompt + request.max_tokens > max_seq_)
    api_fail(
        400, "max_tokens",
        "this model's context is {} tokens, but the prompt has {} and max_tokens asks for {} more: shorten "
        "the prompt or lower max_tokens to at most {}",
        max_seq_, prompt, request.max_tokens, std::max<int64_t>(max_seq_ - prompt, 0));
  const int64_t capacity = prompt + request.max_tokens;
  if (capacity > kv_tokens_)
    api_fail(
        400, "max_tokens",
        "the request needs {} KV-cache positions (prompt {} + max_tokens {}) but a replica holds {}: lower "
        "max_tokens or start the server with a larger --kv-cache-mb",
        capacity, prompt, request.max_tokens, kv_tokens_);
  auto state = std::make_shared<RequestState>(std::move(request));
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || failed_) api_fail(503, "", "the server is shutting down");
    if (waiting_total_ >= static_cast<size_t>(options_.max_waiting))
      api_fail(503, "", "{} requests are already waiting (--max-waiting): retry later", waiting_total_);
    // The least loaded replica: KV positions reserved by its running and waiting requests.
    size_t best = 0;
    for (size_t r = 1; r < replicas_.size(); ++r) {
      const Replica& a = replicas_[r];
      const Replica& b = replicas_[best];
      if (a.kv_reserved + a.kv_waiting < b.kv_reserved + b.kv_waiting) best = r;
    }
    replicas_[best].waiting.push_back(state);
    replicas_[best].kv_waiting += capacity;
    ++waiting_total_;
    update_gauges_locked();
  }
  work_.notify_all();
  return state;
}

bool Scheduler::has_work_locked() const {
  for (const Replica& r : replicas_)
    if (!r.waiting.empty() || !r.running.empty() || !r.pending_remove.empty()) return true;
  return false;
}

void Scheduler::release_locked(Replica& r, size_t i) {
  r.pending_remove.push_back(r.running[i].slot);
  r.kv_reserved -= r.running[i].capacity;
  r.running.erase(r.running.begin() + static_cast<std::ptrdiff_t>(i));
}

void Scheduler::drop_cancelled_locked(Replica& r) {
  for (size_t i = r.running.size(); i-- > 0;)
    if (r.running[i].state->cancelled()) {
      r.running[i].state->finish(FinishReason::Cancelled);
      metrics_.request_cancelled();
      release_locked(r, i);
    }
  for (auto it = r.waiting.begin(); it != r.waiting.end();) {
    if ((*it)->cancelled()) {
      (*it)->finish(FinishReason::Cancelled);
      metrics_.request_cancelled();
      r.kv_waiting -= static_cast<int64_t>((*it)->request().prompt.size()) + (*it)->request().max_tokens;
      --waiting_total_;
      it = r.waiting.erase(it);
    } else {
      ++it;
    }
  }
}

ReplicaStep Scheduler::plan_replica_locked(Replica& r) {
  ReplicaStep step;
  step.remove.swap(r.pending_remove);
  int64_t budget = options_.max_batch_tokens;
  auto sequence = [](const Running& run, std::vector<int32_t> tokens, bool sample) {
    SequenceStep s;
    s.slot = run.slot;
    s.tokens = std::move(tokens);
    s.sample = sample;
    s.sampling = run.state->request().sampling;
    s.seed = run.state->request().seed;
    s.index = run.state->generated();
    s.trace_logits = run.state->request().trace_logits;
    return s;
  };
  auto next_chunk = [&](Running& run) -> bool {  // false: the budget has no room for the chunk
    const auto& prompt = run.state->request().prompt;
    const int64_t chunk =
        std::min<int64_t>(options_.prefill_chunk, static_cast<int64_t>(prompt.size()) - run.prefilled);
    if (chunk > budget) return false;
    std::vector<int32_t> tokens(prompt.begin() + run.prefilled, prompt.begin() + run.prefilled + chunk);
    run.prefilled += chunk;
    budget -= chunk;
    step.sequences.push_back(
        sequence(run, std::move(tokens), run.prefilled == static_cast<int64_t>(prompt.size())));
    return true;
  };
  // Decode first: a running request never waits behind a new prompt.
  for (Running& run : r.running)
    if (run.prefilled == static_cast<int64_t>(run.state->request().prompt.size()) && budget > 0) {
      step.sequences.push_back(sequence(run, {run.state->last_token()}, true));
      --budget;
    }
  for (Running& run : r.running)
    if (run.prefilled < static_cast<int64_t>(run.state->request().prompt.size()) && !next_chunk(run)) break;
  // Admission, first come first served: the head of the queue waits for room rather than being overtaken.
  while (!r.waiting.empty() && static_cast<int64_t>(r.running.size()) < options_.max_running) {
    const std::shared_ptr<RequestState>& head = r.waiting.front();
    const int64_t capacity = static_cast<int64_t>(head->request().prompt.size()) + head->request().max_tokens;
    const int64_t first_chunk =
        std::min<int64_t>(options_.prefill_chunk, static_cast<int64_t>(head->request().prompt.size()));
    if (r.kv_reserved + capacity > kv_tokens_ || first_chunk > budget) break;
    Running run;
    run.state = head;
    run.slot = next_slot_++;
    run.capacity = capacity;
    r.kv_reserved += capacity;
    r.kv_waiting -= capacity;
    --waiting_total_;
    r.waiting.pop_front();
    step.add.emplace_back(run.slot, capacity);
    r.running.push_back(std::move(run));
    next_chunk(r.running.back());
  }
  return step;
}

std::optional<StepPlan> Scheduler::next_step() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (failed_) return std::nullopt;
    for (Replica& r : replicas_) drop_cancelled_locked(r);
    if (has_work_locked()) break;
    if (stopping_) return std::nullopt;
    update_gauges_locked();
    // Cancellation only sets a flag: wake now and then to free a cancelled request's cache promptly.
    work_.wait_for(lock, std::chrono::milliseconds(50));
  }
  StepPlan plan;
  for (Replica& r : replicas_) {
    plan.replicas.push_back(plan_replica_locked(r));
    for (const SequenceStep& s : plan.replicas.back().sequences) {
      plan.runs_engine = true;
      // A prompt chunk makes the step a prefill: every replica then takes the prefill collectives.
      if (s.prompt_chunk()) plan.prefill = true;
    }
  }
  update_gauges_locked();
  return plan;
}

void Scheduler::complete_step(const StepPlan& plan, const StepTokens& tokens) {
  std::lock_guard lock(mutex_);
  const Clock::time_point now = Clock::now();
  // Requests that end with this step are told so only after the gauges count them out: a client that reads
  // /metrics once its answer arrives sees them gone.
  std::vector<std::pair<std::shared_ptr<RequestState>, FinishReason>> ended;
  for (size_t ri = 0; ri < plan.replicas.size(); ++ri) {
    Replica& r = replicas_[ri];
    size_t next = 0, next_hash = 0;
    for (const SequenceStep& s : plan.replicas[ri].sequences) {
      if (s.prompt_chunk()) metrics_.prompt_tokens(static_cast<int64_t>(s.tokens.size()));
      if (!s.sample) continue;
      EXPAR_ASSERT(next < tokens[ri].tokens.size(),
                   "replica {} returned {} tokens for a step that samples more", ri,
                   tokens[ri].tokens.size());
      const int32_t token = tokens[ri].tokens[next++];
      const uint64_t hash = s.trace_logits ? tokens[ri].logits_hashes.at(next_hash++) : 0;
      auto it = std::find_if(r.running.begin(), r.running.end(),
                             [&](const Running& x) { return x.slot == s.slot; });
      if (it == r.running.end()) continue;  // cancelled while the step ran
      RequestState& state = *it->state;
      if (!state.first_token_at) {
        state.first_token_at = now;
        metrics_.time_to_first_token(std::chrono::duration<double>(now - state.arrived).count());
      } else {
        metrics_.time_per_output_token(std::chrono::duration<double>(now - state.last_token_at).count());
      }
      state.last_token_at = now;
      if (s.trace_logits) state.push_logits_hash(hash);
      const auto& stops = state.request().stop_token_ids;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
        ended.emplace_back(it->state, FinishReason::Stop);
        release_locked(r, static_cast<size_t>(it - r.running.begin()));
        continue;
      }
      state.push_token(token);
      metrics_.generated_tokens(1);
      if (static_cast<int64_t>(state.generated()) >= state.request().max_tokens) {
        ended.emplace_back(it->state, FinishReason::Length);
        release_locked(r, static_cast<size_t>(it - r.running.begin()));
      }
    }
  }
  update_gauges_locked();
  for (const auto& [state, reason] : ended) state->finish(reason);
}

void Scheduler::stop(bool cancel_in_flight) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (cancel_in_flight)
      for (Replica& r : replicas_) {
        for (Running& run : r.running) run.state->cancel();
        for (auto& w : r.waiting) w->cancel();
      }
  }
  work_.notify_all();
}

void Scheduler::fail(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    failed_ = true;
    for (Replica& r : replicas_) {
      for (Running& run : r.running) run.state->finish(FinishReason::Error, message);
      for (auto& w : r.waiting) w->finish(FinishReason::Error, message);
      r.running.clear();
      r.waiting.clear();
    }
    waiting_total_ = 0;
  }
  work_.notify_all();
}

void Scheduler::update_gauges_locked() {
  int64_t running = 0;
  double usage = 0.0;
  for (const Replica& r : replicas_) {
    running += static_cast<int64_t>(r.running.size());
    usage = std::max(usage, static_cast<double>(r.kv_reserved) / static_cast<double>(kv_tokens_));
  }
  metrics_.set_queue(running, static_cast<int64_t>(waiting_total_), usage);
}

}  // namespace expar::serve
