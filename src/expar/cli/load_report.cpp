#include "expar/cli/load_report.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "expar/cli/layout_options.hpp"
#include "expar/core/memory.hpp"
#include "expar/infer/load_progress.hpp"
#include "expar/infer/rank_memory_plan.hpp"

namespace expar::cli {

LoadReport::LoadReport(std::string command, const infer::ModelSpec& spec,
                       const infer::GenerateOptions& options, int64_t kv_tokens)
    : command_(std::move(command)) {
  const InferenceLayout layout = infer::inference_layout(options, spec.config);
  const std::vector<infer::RankMemoryPlan> plans =
      infer::plan_inference_memory(spec, layout, kv_tokens, options.weight_dtype);
  fmt::print(stderr, "{}: loading '{}' on TP {} x DP {}, EP {}; each rank holds:\n{}", command_,
             spec.dir.string(), layout.tp(), layout.dp(),
             ep_label(layout.expert_parallel(), layout.ep_degree(), layout.tp(), layout.dp()),
             infer::format_rank_plans(plans));
  if (spec.features.ignored_mtp_layers > 0)
    fmt::print(stderr,
               "{}: not loading the {} multi-token-prediction layer(s) after layer {} "
               "(num_nextn_predict_layers): generation does not use them\n",
               command_, spec.features.ignored_mtp_layers, spec.config.layers - 1);
  for (const infer::RankMemoryPlan& p : plans)
    total_bytes_ += p.dense_bytes + p.expert_bytes + p.mapped_bytes;
  total_parts_ = static_cast<int64_t>(plans.size()) * (spec.config.layers + 1);
  infer::load_progress().reset();
  watcher_ = std::thread([this] { watch(); });
}

LoadReport::~LoadReport() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  watcher_.join();
}

void LoadReport::watch() {
  using Clock = std::chrono::steady_clock;
  const bool tty = isatty(fileno(stderr)) != 0;
  const Clock::time_point start = Clock::now();
  int quarters_told = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    const bool stopping = wake_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; });
    const int64_t bytes = infer::load_progress().bytes, parts = infer::load_progress().parts;
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const bool done = parts >= total_parts_;
    if (stopping && !done) return;  // the load failed or was not watched to its end: its error says why
    const double rate = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
    const double fraction =
        total_bytes_ > 0 ? static_cast<double>(bytes) / static_cast<double>(total_bytes_) : 1.0;
    if (done) {
      fmt::print(stderr, "{}{}: loaded {} in {:.1f} s ({}/s)\n", tty ? "\r\033[K" : "", command_,
                 format_bytes(bytes), seconds, format_bytes(static_cast<int64_t>(rate)));
      return;
    }
    const std::string line =
        fmt::format("{}: loading {} of {} ({:.0f} %), {} of {} layers over the ranks, {}/s, {} s left",
                    command_, format_bytes(bytes), format_bytes(total_bytes_), 100.0 * fraction, parts,
                    total_parts_, format_bytes(static_cast<int64_t>(rate)),
                    rate > 0 ? fmt::format("{:.0f}", static_cast<double>(total_bytes_ - bytes) / rate) : "?");
    if (tty) {
      fmt::print(stderr, "\r\033[K{}", line);
    } else if (static_cast<int>(fraction * 4) > quarters_told) {
      quarters_told = static_cast<int>(fraction * 4);
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }
}

}  // namespace expar::cli
