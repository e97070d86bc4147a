#include "expar/serve/request_state.hpp"

namespace expar::serve {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Length:
      return "length";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
    case FinishReason::None:
      break;
  }
  return "none";
}

std::vector<int32_t> RequestState::wait_tokens(size_t seen) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return tokens_.size() > seen || reason_ != FinishReason::None; });
  if (tokens_.size() <= seen) return {};
  return {tokens_.begin() + static_cast<std::ptrdiff_t>(seen), tokens_.end()};
}

bool RequestState::finished() const {
  std::lock_guard lock(mutex_);
  return reason_ != FinishReason::None;
}

FinishReason RequestState::finish_reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

std::string RequestState::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void RequestState::push_token(int32_t token) {
  {
    std::lock_guard lock(mutex_);
    tokens_.push_back(token);
  }
  changed_.notify_all();
}

void RequestState::finish(FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (reason_ != FinishReason::None) return;
    reason_ = reason;
    error_ = std::move(error);
  }
  changed_.notify_all();
}

size_t RequestState::generated() const {
  std::lock_guard lock(mutex_);
  return tokens_.size();
}

int32_t RequestState::last_token() const {
  std::lock_guard lock(mutex_);
  return tokens_.empty() ? -1 : tokens_.back();
}

void RequestState::push_logits_hash(uint64_t hash) {
  std::lock_guard lock(mutex_);
  logits_hashes_.push_back(hash);
}

std::vector<uint64_t> RequestState::logits_hashes() const {
  std::lock_guard lock(mutex_);
  return logits_hashes_;
}

}  // namespace expar::serve
