#pragma once
// The server's Prometheus metrics (GET /metrics, text exposition format 0.0.4). Thread-safe.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace expar::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}
  void observe(double value);
  // Appends "# TYPE", the _bucket lines, _sum and _count.
  void render(const std::string& name, const std::string& help, std::string& out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // observations <= bounds_[i] (not cumulative; summed when rendered)
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

class Metrics {
 public:
  Metrics();
  void request_finished(int http_status);
  void request_cancelled();  // dropped by the scheduler: client gone, stop string found, or shutdown
  void prompt_tokens(int64_t n);
  void generated_tokens(int64_t n);
  void time_to_first_token(double seconds);
  void time_per_output_token(double seconds);
  void set_queue(int64_t running, int64_t waiting, double kv_usage);
  // Routed tokens per expert on one world rank (its local experts, global ids), added per step.
  void expert_tokens(int rank, const std::vector<int64_t>& per_expert);
  // Per MoE layer, (max - mean) / mean of the rows each rank's experts computed over the EPLB window.
  void expert_imbalance(std::vector<double> per_layer);
  // A rebalance moved `layers` MoE layers' placements, `bytes` of expert weights (all ranks), in `seconds`
  // (the slowest rank).
  void experts_moved(int layers, int64_t bytes, double seconds);
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> requests_by_status_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0, cancelled_ = 0;
  Histogram ttft_, tpot_;
  int64_t running_ = 0, waiting_ = 0;
  double kv_usage_ = 0.0;
  std::map<int, std::vector<int64_t>> expert_tokens_;
  std::vector<double> expert_imbalance_;
  uint64_t rebalances_ = 0, moved_layers_ = 0, moved_bytes_ = 0;
  Histogram move_seconds_;
};

}  // namespace expar::serve
