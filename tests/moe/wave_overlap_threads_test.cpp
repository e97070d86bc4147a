// The wave-overlapped schedule (moe/wave_schedule.hpp, --wave-overlap) really runs its steps side by side,
// checked by the order of events, not by timing: the experts of wave i run while wave i+1's rows are brought
// and wave i-1's are sent. Outputs cannot show this (waves_threads_test proves the bits equal the no-wave
// step's, which a sequential runner would also pass).
//
// A WaveObserver makes it deterministic: each step that the schedule promises to overlap with another waits,
// at its begin, until the other has begun too (a rendezvous); so both are begun before either ends, in any
// interleaving. A runner that does not overlap them can never meet its partner: the wait times out and the
// test fails (rather than passing, or hanging). Checked on the runner alone and through the MoE layer's
// forward and backward on every path that runs waves.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/wave_schedule.hpp"

namespace expar {
namespace {

// Far above any scheduling delay (under ThreadSanitizer, on a loaded machine); only a runner that does not
// overlap waits this long.
constexpr auto kRendezvousTimeout = std::chrono::seconds(60);

// Set by the first rendezvous that times out: later ones (other probes too) do not wait, so a runner that
// does not overlap fails after one timeout, not one per wave.
std::atomic<bool> g_gave_up{false};

struct Event {
  WaveStep step;
  int wave;
  bool begin;
  std::thread::id thread;
};

std::string event_name(WaveStep step, int wave) {
  return fmt::format("{} {}", wave_step_name(step), wave);
}

// Records every step's begin and end and holds each overlapping pair at a rendezvous: compute(i) with
// bring(i+1) and with send(i-1).
class OverlapProbe : public WaveObserver {
 public:
  explicit OverlapProbe(int waves) : waves_(waves) {}

  void begin(WaveStep step, int wave) override {
    std::unique_lock lock(mutex_);
    events_.push_back({step, wave, true, std::this_thread::get_id()});
    cv_.notify_all();
    for (const auto& [other, other_wave] : partners(step, wave)) {
      if (g_gave_up.load()) return;
      const bool met = cv_.wait_for(lock, kRendezvousTimeout, [&] { return begun(other, other_wave); });
      if (!met) {
        g_gave_up.store(true);
        problems_.push_back(fmt::format("{} waited {} s for {} to begin: the two do not overlap",
                                        event_name(step, wave), kRendezvousTimeout.count(),
                                        event_name(other, other_wave)));
        cv_.notify_all();
        return;
      }
    }
  }

  void end(WaveStep step, int wave) override {
    std::lock_guard lock(mutex_);
    events_.push_back({step, wave, false, std::this_thread::get_id()});
    cv_.notify_all();
  }

  // What the schedule promises, from the log: every step once, in order on its thread; bring and send on one
  // communication thread, in the order b0, b1, s0, b2, s1, ..., s(n-1); compute on another thread, each
  // compute after its bring ended and before its send began; each rendezvous pair's intervals intersect.
  std::vector<std::string> check() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out = problems_;
    auto index_of = [&](WaveStep step, int wave, bool begin) -> std::optional<size_t> {
      for (size_t i = 0; i < events_.size(); ++i)
        if (events_[i].step == step && events_[i].wave == wave && events_[i].begin == begin) return i;
      return std::nullopt;
    };
    if (events_.size() != static_cast<size_t>(6 * waves_))
      out.push_back(fmt::format("{} events, want {} (3 steps x begin, end x {} waves)", events_.size(),
                                6 * waves_, waves_));
    std::vector<std::pair<WaveStep, int>> comm_order, want_order;
    for (int i = 0; i < waves_; ++i) {
      want_order.emplace_back(WaveStep::Bring, i);
      if (i >= 1) want_order.emplace_back(WaveStep::Send, i - 1);
    }
    want_order.emplace_back(WaveStep::Send, waves_ - 1);
    std::optional<std::thread::id> comm_thread, compute_thread;
    for (const Event& e : events_) {
      std::optional<std::thread::id>& t = e.step == WaveStep::Compute ? compute_thread : comm_thread;
      if (!t) t = e.thread;
      if (*t != e.thread)
        out.push_back(fmt::format("{} ran on a second {} thread", event_name(e.step, e.wave),
                                  e.step == WaveStep::Compute ? "compute" : "communication"));
      if (e.begin && e.step != WaveStep::Compute) comm_order.emplace_back(e.step, e.wave);
    }
    if (comm_thread && compute_thread && *comm_thread == *compute_thread)
      out.push_back("bring, send and compute ran on one thread");
    if (comm_order != want_order) {
      std::vector<std::string> got;
      for (const auto& [s, w] : comm_order) got.push_back(event_name(s, w));
      out.push_back(
          fmt::format("communication order: {}; want b0, b1, s0, b2, s1, ..., s(n-1)", fmt::join(got, ", ")));
    }
    auto before = [&](WaveStep a, int wa, bool a_begin, WaveStep b, int wb, bool b_begin) {
      const auto ia = index_of(a, wa, a_begin), ib = index_of(b, wb, b_begin);
      if (!ia || !ib || *ia >= *ib)
        out.push_back(fmt::format("{} {} did not come before {} {}", event_name(a, wa),
                                  a_begin ? "begin" : "end", event_name(b, wb), b_begin ? "begin" : "end"));
    };
    for (int i = 0; i < waves_; ++i) {
      before(WaveStep::Bring, i, false, WaveStep::Compute, i, true);
      before(WaveStep::Compute, i, false, WaveStep::Send, i, true);
      for (const auto& [other, other_wave] : partners(WaveStep::Compute, i)) {
        before(WaveStep::Compute, i, true, other, other_wave, false);  // the two intervals intersect
        before(other, other_wave, true, WaveStep::Compute, i, false);
      }
    }
    return out;
  }

 private:
  // The steps that must run beside `step` of `wave` (the schedule's promise).
  std::vector<std::pair<WaveStep, int>> partners(WaveStep step, int wave) const {
    std::vector<std::pair<WaveStep, int>> p;
    switch (step) {
      case WaveStep::Compute:
        if (wave + 1 < waves_) p.emplace_back(WaveStep::Bring, wave + 1);
        if (wave >= 1) p.emplace_back(WaveStep::Send, wave - 1);
        break;
      case WaveStep::Bring:
        if (wave >= 1) p.emplace_back(WaveStep::Compute, wave - 1);
        break;
      case WaveStep::Send:
        if (wave + 1 < waves_) p.emplace_back(WaveStep::Compute, wave + 1);
        break;
    }
    return p;
  }

  bool begun(WaveStep step, int wave) const {
    for (const Event& e : events_)
      if (e.step == step && e.wave == wave && e.begin) return true;
    return false;
  }

  const int waves_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Event> events_;
  std::vector<std::string> problems_;
};

void expect_no_problems(const std::vector<std::string>& problems, const std::string& where) {
  for (const std::string& p : problems) ADD_FAILURE() << where << ": " << p;
}

TEST(WaveOverlap, TheRunnerOverlapsComputeWithTheNextBringAndThePreviousSend) {
  for (int waves : {2, 3, 5}) {
    OverlapProbe probe(waves);
    std::vector<int> computed;
    {
      WaveObserverBinding bind(probe);
      run_wave_schedule(
          WaveSchedule::Overlapped, waves, [](int) {}, [&](int i) { computed.push_back(i); }, [](int) {});
    }
    EXPECT_EQ(computed.size(), static_cast<size_t>(waves));
    expect_no_problems(probe.check(), fmt::format("{} waves", waves));
  }
}

TEST(WaveOverlap, UnboundObserverSeesNothingAndBindingsNest) {
  EXPECT_EQ(bound_wave_observer(), nullptr);
  OverlapProbe outer(2), inner(2);
  {
    WaveObserverBinding a(outer);
    {
      WaveObserverBinding b(inner);
      EXPECT_EQ(bound_wave_observer(), &inner);
    }
    EXPECT_EQ(bound_wave_observer(), &outer);
  }
  EXPECT_EQ(bound_wave_observer(), nullptr);
}

// Through the layer as `--waves 3 --wave-overlap` runs it: forward and backward, each rank with its own probe
// (the rendezvous only holds a rank's own threads; the collectives inside bring and send still match).
TEST(WaveOverlap, TheMoeLayerOverlapsForwardAndBackwardOnEveryWavePath) {
  constexpr int kExperts = 6, kRanks = 2, kWaves = 3;
  constexpr int64_t kD = 16, kH = 8, kTokens = 10;
  std::vector<std::string> paths;
  for (const PathTraits& t : path_registry())
    if (t.waves) paths.push_back(t.name);
  ASSERT_FALSE(paths.empty());
  std::mutex mutex;
  std::vector<std::string> problems;
  int passes = 0;
  LaunchOptions launch;
  launch.ranks = kRanks;
  launch.timeout_seconds = 600;
  run_ranks(launch, [&](Comm& world) {
    for (const std::string& path : paths) {
      MoeConfig cfg;
      cfg.router.num_experts = kExperts;
      cfg.router.top_k = 2;
      cfg.model_dim = kD;
      cfg.hidden_dim = kH;
      MoeExecution run;
      run.path = path;
      run.waves = WaveConfig{kWaves, true};
      MoeLayer layer(cfg, run, world);
      layer.init_params(5);
      layer.zero_grads();
      Tensor x = Tensor::empty({kTokens, kD}), grad_y = Tensor::empty({kTokens, kD});
      fill_normal(x, 5, 1 + static_cast<uint64_t>(world.rank()), 1.0f);
      fill_normal(grad_y, 5, 10 + static_cast<uint64_t>(world.rank()), 1.0f);
      MoeState state;
      OverlapProbe forward(kWaves), backward(kWaves);
      {
        WaveObserverBinding bind(forward);
        layer.forward(x, state);
      }
      {
        WaveObserverBinding bind(backward);
        layer.backward(grad_y, state);
      }
      std::lock_guard lock(mutex);
      for (const auto& [probe, pass] : {std::pair{&forward, "forward"}, std::pair{&backward, "backward"}}) {
        for (const std::string& p : probe->check())
          problems.push_back(fmt::format("{} {} rank {}: {}", path, pass, world.rank(), p));
        ++passes;
      }
    }
  });
  EXPECT_EQ(passes, 2 * kRanks * static_cast<int>(paths.size()));
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

}  // namespace
}  // namespace expar
