#pragma once
// Phase timing hooks for `expar bench paths` (seed 000 Table 7, Figure 17). The MoE layer and the execution
// paths wrap each phase of a step in a PhaseScope; the scope times itself only when the calling thread has
// a PhaseTimer bound (ranks are threads, so each rank binds its own). Unbound, a scope costs one
// thread-local load and a branch, and nothing a path computes depends on it.
//
// A backward step reuses the name of the forward phase it is the adjoint of (contract 5, docs/design.md): the
// backward of "all-to-all (dispatch)" is the all-to-all that returns the input gradient rows. The bench
// binds one timer for forward and another for backward.
#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace expar {

class Comm;

// Phase names shared by the hooks and the bench.
namespace phase {
inline constexpr const char* kRouter = "router";
inline constexpr const char* kRouteMap = "route-map build";
inline constexpr const char* kLocalPermute = "local permute";
inline constexpr const char* kAllToAllDispatch = "all-to-all (dispatch)";
inline constexpr const char* kGlobalPermute = "global permute";
inline constexpr const char* kGroupedGemm = "grouped GEMM";
inline constexpr const char* kGlobalUnpermute = "global unpermute";
inline constexpr const char* kAllToAllCombine = "all-to-all (combine)";
inline constexpr const char* kLocalUnpermuteMerge = "local unpermute + merge";
inline constexpr const char* kRowDispatch = "row dispatch";
inline constexpr const char* kRowGatherReduce = "row gather + weighted reduce";
inline constexpr const char* kAllGather = "all-gather";
inline constexpr const char* kRowCopy = "expert row copy";
inline constexpr const char* kPartialMerge = "partial merge";
inline constexpr const char* kReduceScatter = "reduce-scatter";
inline constexpr const char* kWait = "wait for peers";
}  // namespace phase

// Seconds per phase, summed over every scope of that name since the last clear(), in first-seen order.
class PhaseTimer {
 public:
  void add(std::string_view phase, double seconds);
  // 0 for a phase never recorded.
  double seconds(std::string_view phase) const;
  double total() const;
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  void clear() { phases_.clear(); }
  // With sync_comm set, every communication phase first waits at a barrier of its group (sync_before_comm),
  // booked as phase::kWait, so that the phase itself measures moving rows rather than the slowest peer.
  void set_sync_comm(bool on) { sync_comm_ = on; }
  bool sync_comm() const { return sync_comm_; }

 private:
  std::vector<std::pair<std::string, double>> phases_;
  bool sync_comm_ = false;
};

// The timer bound to the calling thread (null when none).
PhaseTimer* bound_phase_timer() noexcept;

// Binds `timer` to the calling thread for the lifetime of the guard (restores the previous one after).
class PhaseTimerBinding {
 public:
  explicit PhaseTimerBinding(PhaseTimer* timer) noexcept;
  ~PhaseTimerBinding();
  PhaseTimerBinding(const PhaseTimerBinding&) = delete;
  PhaseTimerBinding& operator=(const PhaseTimerBinding&) = delete;

 private:
  PhaseTimer* previous_;
};

// Called by a path right before a communication phase: a barrier of `group`, timed as phase::kWait, when
// the bound timer asks for it (sync_comm); otherwise nothing. Every rank of the group runs the same
// sequence of phases, so the barriers match; no row or result depends on it.
void sync_before_comm(Comm& group);

// Adds the wall time from construction to destruction (or to stop()) to `phase` of the bound timer.
class PhaseScope {
 public:
  explicit PhaseScope(const char* phase) noexcept : timer_(bound_phase_timer()), phase_(phase) {
    if (timer_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~PhaseScope() { stop(); }
  void stop() {
    if (timer_ == nullptr) return;
    timer_->add(phase_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    timer_ = nullptr;
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* timer_;
  const char* phase_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace expar
