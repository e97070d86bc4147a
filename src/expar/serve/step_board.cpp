#include "expar/serve/step_board.hpp"

#include <algorithm>

namespace expar::serve {

void StepBoard::loaded(int64_t kv_bytes_per_token) {
  {
    std::lock_guard lock(mutex_);
    ++loaded_;
    kv_bytes_per_token_ = std::max(kv_bytes_per_token_, kv_bytes_per_token);
  }
  changed_.notify_all();
}

StepBoard::Next StepBoard::wait_next(uint64_t& seen, const StepPlan*& plan,
                                     std::optional<std::chrono::duration<double>> idle_after) {
  std::unique_lock lock(mutex_);
  auto ready = [&] { return generation_ > seen || done_ || !failure_.empty(); };
  if (idle_after) {
    if (!changed_.wait_for(lock, *idle_after, ready)) return Next::Idle;
  } else {
    changed_.wait(lock, ready);
  }
  if (done_ || !failure_.empty()) return Next::Done;
  seen = generation_;
  plan = plan_;
  return Next::Step;
}

void StepBoard::deliver(int rank, RankResult result, Metrics& metrics) {
  if (!result.layer_expert_tokens.empty()) {
    std::vector<int64_t> per_expert(result.layer_expert_tokens.front().size(), 0);
    for (const std::vector<int64_t>& layer : result.layer_expert_tokens)
      for (size_t e = 0; e < layer.size() && e < per_expert.size(); ++e) per_expert[e] += layer[e];
    metrics.expert_tokens(rank, per_expert);
  }
  std::lock_guard lock(mutex_);
  std::vector<std::vector<int64_t>>& sum = load_.layer_expert_tokens;
  if (sum.size() < result.layer_expert_tokens.size()) sum.resize(result.layer_expert_tokens.size());
  for (size_t l = 0; l < result.layer_expert_tokens.size(); ++l) {
    const std::vector<int64_t>& mine = result.layer_expert_tokens[l];
    if (sum[l].size() < mine.size()) sum[l].resize(mine.size(), 0);
    for (size_t e = 0; e < mine.size(); ++e) sum[l][e] += mine[e];
  }
  if (load_.layer_rows.size() <= static_cast<size_t>(rank))
    load_.layer_rows.resize(static_cast<size_t>(rank) + 1);
  load_.layer_rows[static_cast<size_t>(rank)] = std::move(result.layer_rows);
  load_.moved_bytes += result.moved_bytes;
  load_.move_seconds = std::max(load_.move_seconds, result.move_seconds);
  if (!result.samples) return;
  tokens_.at(static_cast<size_t>(result.dp_rank)) = std::move(result.tokens);
}

void StepBoard::arrive() {
  {
    std::lock_guard lock(mutex_);
    ++arrived_;
  }
  changed_.notify_all();
}

void StepBoard::fail(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = message.empty() ? "a rank failed without a message" : message;
  }
  changed_.notify_all();
}

bool StepBoard::wait_loaded() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return loaded_ == local_ranks_ || !failure_.empty(); });
  return failure_.empty();
}

int64_t StepBoard::kv_bytes_per_token() const {
  std::lock_guard lock(mutex_);
  return kv_bytes_per_token_;
}

bool StepBoard::run(const StepPlan& plan, StepTokens& tokens, StepLoad& load) {
  {
    std::lock_guard lock(mutex_);
    plan_ = &plan;
    tokens_.assign(static_cast<size_t>(replicas_), {});
    load_ = {};
    arrived_ = 0;
    ++generation_;
  }
  changed_.notify_all();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return arrived_ == local_ranks_ || !failure_.empty(); });
  if (!failure_.empty()) return false;
  tokens = std::move(tokens_);
  load = std::move(load_);
  return true;
}

void StepBoard::finish() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  changed_.notify_all();
}

std::string StepBoard::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

}  // namespace expar::serve
