#include "expar/serve/metrics.hpp"

#include <fmt/format.h>

namespace expar::serve {

void Histogram::observe(double value) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (value <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  ++count_;
  sum_ += value;
}

void Histogram::render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name,
                     count_);
}

namespace {
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0};
}
}  // namespace

Metrics::Metrics() : ttft_(latency_bounds()), tpot_(latency_bounds()), move_seconds_(latency_bounds()) {}

void Metrics::request_finished(int http_status) {
  std::lock_guard lock(mutex_);
  ++requests_by_status_[http_status];
}
void Metrics::request_cancelled() {
  std::lock_guard lock(mutex_);
  ++cancelled_;
}
void Metrics::prompt_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}
void Metrics::generated_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  generated_tokens_ += static_cast<uint64_t>(n);
}
void Metrics::time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}
void Metrics::time_per_output_token(double seconds) {
  std::lock_guard lock(mutex_);
  tpot_.observe(seconds);
}
void Metrics::set_queue(int64_t running, int64_t waiting, double kv_usage) {
  std::lock_guard lock(mutex_);
  running_ = running;
  waiting_ = waiting;
  kv_usage_ = kv_usage;
}
void Metrics::expert_tokens(int rank, const std::vector<int64_t>& per_expert) {
  std::lock_guard lock(mutex_);
  auto& v = expert_tokens_[rank];
  if (v.size() < per_expert.size()) v.resize(per_expert.size(), 0);
  for (size_t e = 0; e < per_expert.size(); ++e) v[e] += per_expert[e];
}

void Metrics::expert_imbalance(std::vector<double> per_layer) {
  std::lock_guard lock(mutex_);
  expert_imbalance_ = std::move(per_layer);
}
void Metrics::experts_moved(int layers, int64_t bytes, double seconds) {
  std::lock_guard lock(mutex_);
  ++rebalances_;
  moved_layers_ += static_cast<uint64_t>(layers);
  moved_bytes_ += static_cast<uint64_t>(bytes);
  move_seconds_.observe(seconds);
}

std::string Metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out +=
      "# HELP expar_requests_total Finished HTTP requests on the generation endpoints, by status.\n"
      "# TYPE expar_requests_total counter\n";
  for (const auto& [status, n] : requests_by_status_)
    out += fmt::format("expar_requests_total{{status=\"{}\"}} {}\n", status, n);
  out += fmt::format(
      "# HELP expar_prompt_tokens_total Prompt tokens prefilled.\n# TYPE expar_prompt_tokens_total counter\n"
      "expar_prompt_tokens_total {}\n"
      "# HELP expar_generation_tokens_total Tokens generated.\n# TYPE expar_generation_tokens_total counter\n"
      "expar_generation_tokens_total {}\n"
      "# HELP expar_requests_cancelled_total Requests dropped before their end (client gone, stop string, "
      "shutdown).\n# TYPE expar_requests_cancelled_total counter\nexpar_requests_cancelled_total {}\n",
      prompt_tokens_, generated_tokens_, cancelled_);
  ttft_.render("expar_time_to_first_token_seconds", "Arrival to first generated token.", out);
  tpot_.render("expar_time_per_output_token_seconds", "Time between consecutive generated tokens.", out);
  out += fmt::format(
      "# HELP expar_requests_running Requests in the running batches.\n# TYPE expar_requests_running gauge\n"
      "expar_requests_running {}\n"
      "# HELP expar_requests_waiting Requests queued for admission.\n# TYPE expar_requests_waiting gauge\n"
      "expar_requests_waiting {}\n"
      "# HELP expar_kv_cache_usage_ratio KV-cache positions reserved / available (fullest replica).\n"
      "# TYPE expar_kv_cache_usage_ratio gauge\nexpar_kv_cache_usage_ratio {}\n",
      running_, waiting_, kv_usage_);
  out +=
      "# HELP expar_expert_tokens_total Routed tokens per expert on the rank that holds it.\n"
      "# TYPE expar_expert_tokens_total counter\n";
  for (const auto& [rank, v] : expert_tokens_)
    for (size_t e = 0; e < v.size(); ++e)
      if (v[e] > 0)
        out += fmt::format("expar_expert_tokens_total{{rank=\"{}\",expert=\"{}\"}} {}\n", rank, e, v[e]);
  out +=
      "# HELP expar_expert_imbalance (max - mean) / mean over the ranks of the rows their experts computed "
      "in "
      "the layer, over the last --eplb-window engine steps.\n# TYPE expar_expert_imbalance gauge\n";
  for (size_t l = 0; l < expert_imbalance_.size(); ++l)
    out += fmt::format("expar_expert_imbalance{{layer=\"{}\"}} {}\n", l, expert_imbalance_[l]);
  out += fmt::format(
      "# HELP expar_eplb_rebalances_total Rebalances that changed an MoE layer's expert placement while "
      "serving.\n"
      "# TYPE expar_eplb_rebalances_total counter\nexpar_eplb_rebalances_total {}\n"
      "# HELP expar_eplb_moved_layers_total MoE layers whose expert placement rebalancing changed (each "
      "layer "
      "has its own).\n"
      "# TYPE expar_eplb_moved_layers_total counter\nexpar_eplb_moved_layers_total {}\n"
      "# HELP expar_eplb_moved_bytes_total Expert weight bytes moved between ranks by rebalancing.\n"
      "# TYPE expar_eplb_moved_bytes_total counter\nexpar_eplb_moved_bytes_total {}\n",
      rebalances_, moved_layers_, moved_bytes_);
  move_seconds_.render("expar_eplb_move_seconds", "Time a rebalance's weight move took (the slowest rank).",
                       out);
  return out;
}

}  // namespace expar::serve
