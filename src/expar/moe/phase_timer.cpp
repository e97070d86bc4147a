#include "expar/moe/phase_timer.hpp"

#include "expar/comm/comm.hpp"

namespace expar {

namespace {
thread_local PhaseTimer* tl_phase_timer = nullptr;
}  // namespace

void PhaseTimer::add(std::string_view phase, double seconds) {
  for (auto& [name, total] : phases_)
    if (name == phase) {
      total += seconds;
      return;
    }
  phases_.emplace_back(std::string(phase), seconds);
}

double PhaseTimer::seconds(std::string_view phase) const {
  for (const auto& [name, total] : phases_)
    if (name == phase) return total;
  return 0.0;
}

double PhaseTimer::total() const {
  double sum = 0.0;
  for (const auto& entry : phases_) sum += entry.second;
  return sum;
}

PhaseTimer* bound_phase_timer() noexcept {
  return tl_phase_timer;
}

void sync_before_comm(Comm& group) {
  PhaseTimer* timer = tl_phase_timer;
  if (timer == nullptr || !timer->sync_comm()) return;
  PhaseScope wait(phase::kWait);
  group.barrier();
}

PhaseTimerBinding::PhaseTimerBinding(PhaseTimer* timer) noexcept : previous_(tl_phase_timer) {
  tl_phase_timer = timer;
}

PhaseTimerBinding::~PhaseTimerBinding() {
  tl_phase_timer = previous_;
}

}  // namespace expar
