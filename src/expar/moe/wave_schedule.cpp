#include "expar/moe/wave_schedule.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "expar/core/matmul.hpp"
#include "expar/core/memory.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

thread_local WaveObserver* t_observer = nullptr;

// Runs step `step` of wave i, reporting its begin and end to `observer` when one is bound.
void observed(WaveObserver* observer, WaveStep step, const std::function<void(int)>& fn, int i) {
  if (observer == nullptr) return fn(i);
  observer->begin(step, i);
  fn(i);
  observer->end(step, i);
}

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Adds the duration of fn() to `into`.
template <typename Fn>
void timed(double& into, Fn&& fn) {
  const auto start = Clock::now();
  fn();
  into += since(start);
}

WaveTimes run_sequential(int waves, const std::function<void(int)>& bring,
                         const std::function<void(int)>& compute, const std::function<void(int)>& send) {
  WaveTimes t;
  PhaseTimer* timer = bound_phase_timer();
  WaveObserver* observer = t_observer;
  // A communication step's barrier waits (booked as phase::kWait by the paths' sync_before_comm) are
  // waiting for peers, not moving rows.
  auto comm_step = [&](WaveStep step, const std::function<void(int)>& fn, int i) {
    const double waited_before = timer != nullptr ? timer->seconds(phase::kWait) : 0.0;
    double seconds = 0.0;
    timed(seconds, [&] { observed(observer, step, fn, i); });
    const double waited = timer != nullptr ? timer->seconds(phase::kWait) - waited_before : 0.0;
    t.comm += seconds - waited;
    t.wait += waited;
  };
  const auto start = Clock::now();
  for (int i = 0; i < waves; ++i) {
    comm_step(WaveStep::Bring, bring, i);
    timed(t.experts, [&] { observed(observer, WaveStep::Compute, compute, i); });
    comm_step(WaveStep::Send, send, i);
  }
  t.wall = since(start);
  return t;
}

// Waits until `counter` exceeds `index` (or the other side failed).
void await_above(std::atomic<int>& counter, int index, const std::atomic<bool>& failed) {
  for (int c = counter.load(); c <= index && !failed.load(); c = counter.load()) counter.wait(c);
}

WaveTimes run_overlapped(int waves, const std::function<void(int)>& bring,
                         const std::function<void(int)>& compute, const std::function<void(int)>& send) {
  WaveTimes t;
  std::atomic<int> brought{0}, computed{0};
  std::atomic<bool> failed{false};
  std::exception_ptr comm_error, compute_error;
  double comm_seconds = 0.0, comm_wait = 0.0;  // written by the comm thread, read after join
  MemoryTracker& tracker = current_tracker();
  WaveObserver* observer = t_observer;
  const auto start = Clock::now();
  auto fail_side = [&](std::exception_ptr& slot, std::atomic<int>& release) {
    slot = std::current_exception();
    failed.store(true);
    release.store(waves + 1);
    release.notify_all();
  };
  std::thread comm([&] {
    TrackerBinding bind(tracker);
    t_observer = observer;
    set_compute_threads(1);
    try {
      auto send_after_compute = [&](int i) {
        timed(comm_wait, [&] { await_above(computed, i, failed); });
        if (failed.load()) return false;
        timed(comm_seconds, [&] { observed(observer, WaveStep::Send, send, i); });
        return true;
      };
      for (int i = 0; i < waves; ++i) {
        timed(comm_seconds, [&] { observed(observer, WaveStep::Bring, bring, i); });
        brought.store(i + 1);
        brought.notify_all();
        if (i >= 1 && !send_after_compute(i - 1)) return;
      }
      send_after_compute(waves - 1);
    } catch (...) {
      fail_side(comm_error, brought);
    }
  });
  try {
    for (int i = 0; i < waves; ++i) {
      await_above(brought, i, failed);
      if (failed.load()) break;
      timed(t.experts, [&] { observed(observer, WaveStep::Compute, compute, i); });
      computed.store(i + 1);
      computed.notify_all();
    }
  } catch (...) {
    fail_side(compute_error, computed);
  }
  comm.join();
  t.wall = since(start);
  t.comm = comm_seconds;
  t.wait = comm_wait;
  if (compute_error) std::rethrow_exception(compute_error);
  if (comm_error) std::rethrow_exception(comm_error);
  return t;
}

}  // namespace

const char* wave_step_name(WaveStep step) {
  switch (step) {
    case WaveStep::Bring:
      return "bring";
    case WaveStep::Compute:
      return "compute";
    case WaveStep::Send:
      return "send";
  }
  return "?";
}

WaveObserverBinding::WaveObserverBinding(WaveObserver& observer) : previous_(t_observer) {
  t_observer = &observer;
}

WaveObserverBinding::~WaveObserverBinding() {
  t_observer = previous_;
}

WaveObserver* bound_wave_observer() {
  return t_observer;
}

WaveTimes run_wave_schedule(WaveSchedule schedule, int waves, const std::function<void(int)>& bring,
                            const std::function<void(int)>& compute, const std::function<void(int)>& send) {
  if (schedule == WaveSchedule::Overlapped) return run_overlapped(waves, bring, compute, send);
  return run_sequential(waves, bring, compute, send);
}

}  // namespace expar
