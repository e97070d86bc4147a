#pragma once
// What a person sees while a checkpoint loads (generate, eval, serve): first the layout and what each rank
// will hold (infer/rank_memory_plan.hpp), then the load's progress from infer::load_progress(): on a
// terminal one line rewritten four times a second (bytes and layers read over the ranks, rate, time left),
// elsewhere one line at each quarter; and the time it took.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "expar/infer/generate.hpp"
#include "expar/infer/hf_config.hpp"

namespace expar::cli {

class LoadReport {
 public:
  // Prints the startup lines and starts watching; `kv_tokens`: the KV positions each rank holds.
  LoadReport(std::string command, const infer::ModelSpec& spec, const infer::GenerateOptions& options,
             int64_t kv_tokens);
  // Stops watching (a load that ended early, by an error, prints nothing more).
  ~LoadReport();
  LoadReport(const LoadReport&) = delete;
  LoadReport& operator=(const LoadReport&) = delete;

 private:
  void watch();
  std::string command_;
  int64_t total_bytes_ = 0, total_parts_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace expar::cli
