#include "expar/bench/waves.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "expar/bench/measure.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar::bench {

namespace {

constexpr size_t kFields = 8;  // forward comm, experts, wall, wait; the same for backward

WavePass pass_of(const std::vector<double>& v, size_t at) {
  return {v[at], v[at + 1], v[at + 2], v[at + 3]};
}

// Medians over repeats of each field.
std::vector<double> medians(const std::vector<std::vector<double>>& samples) {
  std::vector<double> out(kFields);
  for (size_t f = 0; f < kFields; ++f) {
    std::vector<double> v;
    for (const auto& s : samples) v.push_back(s[f]);
    out[f] = median(v);
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

void validate(const WavesBenchOptions& o) {
  validate_setup(o);
  // A wave is a range of the local experts per rank: a wave count fits in [2, local].
  auto fits = [](int w, int local) { return w >= 2 && w <= local; };
  // The fewest local experts that every listed wave count fits, so that a suggested --experts is accepted by
  // the wave rule below too.
  const int per_rank = o.waves.empty() ? 2 : std::max(2, *std::max_element(o.waves.begin(), o.waves.end()));
  EXPAR_CHECK(o.experts % o.ranks == 0,
              "--experts {} is not divisible by --ranks {}: choose --experts a multiple of {} of at least {} "
              "({} per rank for --waves)",
              o.experts, o.ranks, o.ranks, o.ranks * per_rank, per_rank);
  EXPAR_CHECK(path_traits(o.path).waves, "--path {} has no wave schedule: choose a path that runs waves ({})",
              o.path, paths_with(&PathTraits::waves));
  EXPAR_CHECK(!o.waves.empty(), "--waves is empty: list wave counts such as 2,4 (no-wave always runs)");
  const int local = o.experts / o.ranks;
  for (int w : o.waves)
    EXPAR_CHECK(fits(w, local),
                "--waves {}: each wave count must be in [2, {}] (a wave is a range of the {} local experts "
                "per rank; no-wave always runs)",
                w, local, local);
  check_cores(o.ranks, o.threads, o.oversubscribe);
}

WavesReport measure_waves(const WavesBenchOptions& o) {
  validate(o);
  WavesReport report;
  report.options = o;
  report.cores = machine_cores();
  // Schedule 0 is no-wave; then (W, sequential), (W, overlapped) per wave count.
  std::vector<WaveConfig> schedules = {{}};
  for (int w : o.waves) {
    schedules.push_back({w, false});
    schedules.push_back({w, true});
  }
  std::vector<std::vector<double>> result(schedules.size());
  std::vector<bool> identical(schedules.size(), true);
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.compute_threads = o.threads;
  launch.timeout_seconds = 3600;
  run_ranks(launch, [&](Comm& world) {
    MoeConfig c;
    c.router.num_experts = o.experts;
    c.router.top_k = o.top_k;
    c.model_dim = o.model_dim;
    c.hidden_dim = o.hidden_dim;
    MoeExecution e;
    e.path = o.path;
    MoeLayer layer(c, e, world, "bench");
    layer.init_params(o.seed);
    Tensor x = Tensor::empty({o.tokens, o.model_dim}), grad_y = Tensor::empty({o.tokens, o.model_dim});
    fill_normal(x, o.seed, 1000 + static_cast<uint64_t>(world.rank()), 1.0f);
    fill_normal(grad_y, o.seed, 2000 + static_cast<uint64_t>(world.rank()), 1.0f);
    std::vector<std::vector<std::vector<double>>> samples(schedules.size());
    Tensor y_ref, gx_ref;
    std::vector<int> same(schedules.size(), 1);
    // Repeats interleave the schedules, so that drift of the machine hits all of them alike.
    for (int i = 0; i < o.warmup + o.repeats; ++i)
      for (size_t s = 0; s < schedules.size(); ++s) {
        layer.set_waves(schedules[s]);
        layer.zero_grads();
        PhaseTimer forward_timer, backward_timer;
        forward_timer.set_sync_comm(true);
        backward_timer.set_sync_comm(true);
        MoeState state;
        Tensor y, grad_x;
        world.barrier();
        {
          PhaseTimerBinding bind(&forward_timer);
          y = layer.forward(x, state);
        }
        world.barrier();
        {
          PhaseTimerBinding bind(&backward_timer);
          grad_x = layer.backward(grad_y, state);
        }
        const WaveTimes& f = state.forward_times;
        const WaveTimes& b = state.backward_times;
        std::vector<double> v = {f.comm, f.experts, f.wall, f.wait, b.comm, b.experts, b.wall, b.wait};
        max_over_ranks(world, v);
        if (i >= o.warmup) samples[s].push_back(std::move(v));
        if (i + 1 < o.warmup + o.repeats) continue;
        if (s == 0) {
          y_ref = y.clone();
          gx_ref = grad_x.clone();
        } else {
          same[s] = same_bits(y, y_ref) && same_bits(grad_x, gx_ref) ? 1 : 0;
        }
      }
    world.all_reduce(same.data(), same.size(), DType::I32, ReduceOp::Sum);  // == ranks: same on all
    if (world.rank() != 0) return;
    std::lock_guard lock(mutex);
    for (size_t s = 0; s < schedules.size(); ++s) {
      result[s] = medians(samples[s]);
      identical[s] = same[s] == world.size();
    }
  });
  auto run_of = [&](size_t s) {
    WaveRun r;
    r.waves = schedules[s].waves;
    r.overlap = schedules[s].overlap;
    r.forward = pass_of(result[s], 0);
    r.backward = pass_of(result[s], 4);
    r.identical = identical[s];
    return r;
  };
  report.no_wave = run_of(0);
  for (size_t i = 0; i < o.waves.size(); ++i) {
    report.sequential.push_back(run_of(1 + 2 * i));
    report.overlapped.push_back(run_of(2 + 2 * i));
  }
  return report;
}

namespace {

std::string ms(double s) {
  return fmt::format("{:.1f}", s * 1e3);
}

double budget(const WavePass& p) {
  return p.comm + p.experts;
}

std::string core_budget(const WavesReport& r) {
  const WavesBenchOptions& o = r.options;
  const int compute = o.ranks * o.threads, busy = o.ranks * (o.threads + 1);
  const bool spare = static_cast<unsigned>(busy) <= r.cores;
  return fmt::format(
      "core budget: {} ranks x {} compute thread(s) = {} compute threads; overlapped adds 1 communication "
      "thread per rank = {} threads on {} cores: {}",
      o.ranks, o.threads, compute, busy, r.cores,
      spare ? "each communication thread can have a core of its own"
            : "NO spare core: the communication threads take their time from the GEMMs (and the copies they "
              "run are memory-bound work of their own), so ~T_gemm and ~T_comm stretch and eq. 10 measures "
              "that contention, not what overlap gives with a core to spare");
}

std::string pass_table(const WavesReport& r, bool forward) {
  auto pass = [&](const WaveRun& run) -> const WavePass& { return forward ? run.forward : run.backward; };
  const WavePass& none = pass(r.no_wave);
  std::string s = fmt::format("{} (no-wave: T_comm {} + T_gemm {} = {} ms, wall {} ms)\n",
                              forward ? "forward" : "backward", ms(none.comm), ms(none.experts),
                              ms(budget(none)), ms(none.wall));
  s += fmt::format("{:>5} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>28} {:>8} {:>5}\n",
                   "waves", "T_comm", "T_gemm", "T_c+T_g", "seq wall", "T_overlap", "~T_comm", "~T_gemm",
                   "comm x", "gemm x", "ovl wait", "eq.10: T_overlap < T_c+T_g", "/no-wave", "same");
  for (size_t i = 0; i < r.sequential.size(); ++i) {
    const WavePass& q = pass(r.sequential[i]);
    const WavePass& v = pass(r.overlapped[i]);
    const double gain = budget(q) - v.wall;
    s += fmt::format(
        "{:>5} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.2f} {:>7.2f} {:>8} {:>28} {:>8.3f} {:>5}\n",
        r.sequential[i].waves, ms(q.comm), ms(q.experts), ms(budget(q)), ms(q.wall), ms(v.wall), ms(v.comm),
        ms(v.experts), q.comm > 0 ? v.comm / q.comm : 0.0, q.experts > 0 ? v.experts / q.experts : 0.0,
        ms(v.wait),
        fmt::format("{} by {} ({:+.1f}%)", gain > 0 ? "holds" : "FAILS", ms(std::fabs(gain)),
                    budget(q) > 0 ? 100.0 * gain / budget(q) : 0.0),
        budget(none) > 0 ? v.wall / budget(none) : 0.0,
        r.sequential[i].identical && r.overlapped[i].identical ? "yes" : "NO");
  }
  return s;
}

}  // namespace

std::string format_waves_table(const WavesReport& r) {
  const WavesBenchOptions& o = r.options;
  std::string s = fmt::format(
      "expar bench waves (seed 000 §5.9, eq. 10): the MoE layer, path {}, forward and backward; T={} "
      "tokens/rank, d={}, h={}, E={} ({} local per rank), top-{}; median of {} repeats after {} warm-up, max "
      "over ranks\n{}\n",
      o.path, o.tokens, o.model_dim, o.hidden_dim, o.experts, o.experts / o.ranks, o.top_k, o.repeats,
      o.warmup, core_budget(r));
  s += pass_table(r, true);
  s += pass_table(r, false);
  s += fmt::format(
      "  ms. A wave is a range of local experts (each expert's GEMMs unchanged); T_comm, T_gemm: "
      "wave-sequential,\n"
      "  every communication step started with its peers (the barrier waits are not counted); seq wall adds "
      "those waits;\n"
      "  T_overlap: wave-overlapped wall; ~T_comm: its communication thread's busy time (its barriers wait "
      "for slower peers' GEMMs,\n"
      "  so it is an upper bound); ~T_gemm: the experts while overlapped; comm x, gemm x: stretch ~T / T; "
      "ovl "
      "wait: the communication\n"
      "  thread waiting for its own rank's experts; /no-wave: T_overlap / no-wave T_comm + T_gemm (overlap "
      "is "
      "worth keeping only below 1);\n"
      "  same: y and grad_x of both wave schedules bit-identical to no-wave on every rank.\n");
  return s;
}

std::string waves_json(const WavesReport& r) {
  using nlohmann::json;
  const WavesBenchOptions& o = r.options;
  auto pass = [](const WavePass& p) {
    return json{{"comm_seconds", p.comm},
                {"experts_seconds", p.experts},
                {"wall_seconds", p.wall},
                {"wait_seconds", p.wait}};
  };
  auto run = [&](const WaveRun& w) {
    return json{{"waves", w.waves},
                {"overlap", w.overlap},
                {"forward", pass(w.forward)},
                {"backward", pass(w.backward)},
                {"bit_identical_to_no_wave", w.identical}};
  };
  json j;
  j["options"] = setup_json(o);
  j["options"]["path"] = o.path;
  j["options"]["cores"] = r.cores;
  j["core_budget"] = core_budget(r);
  j["no_wave"] = run(r.no_wave);
  json rows = json::array();
  for (size_t i = 0; i < r.sequential.size(); ++i) {
    json row{{"waves", r.sequential[i].waves},
             {"wave_sequential", run(r.sequential[i])},
             {"wave_overlapped", run(r.overlapped[i])}};
    for (const char* which : {"forward", "backward"}) {
      const bool f = std::string(which) == "forward";
      const WavePass& q = f ? r.sequential[i].forward : r.sequential[i].backward;
      const WavePass& v = f ? r.overlapped[i].forward : r.overlapped[i].backward;
      const WavePass& n = f ? r.no_wave.forward : r.no_wave.backward;
      row["eq10"][which] = {{"t_comm_plus_t_gemm", budget(q)},
                            {"t_overlap", v.wall},
                            {"holds", v.wall < budget(q)},
                            {"margin_seconds", budget(q) - v.wall},
                            {"overlap_vs_no_wave", budget(n) > 0 ? v.wall / budget(n) : 0.0}};
    }
    rows.push_back(row);
  }
  j["waves"] = rows;
  return j.dump(2) + "\n";
}

}  // namespace expar::bench
