// `expar bench waves`: seed 000 §5.9 and eq. 10, on this machine. One MoE forward (dispatch, grouped expert
// GEMM, combine) with the routed work split into W waves of consecutive tokens, under three schedules:
//  - no-wave: W = 1, phase-sequential (dispatch all, compute all, combine all);
//  - wave-sequential: for each wave: dispatch, GEMM, combine. The control that separates the cost of smaller
//    GEMMs from the cost of running communication beside them (the seed's archived runs lacked it);
//  - wave-overlapped: communication on its own thread (dispatch wave i+1 and combine wave i-1 while the
//  rank's
//    compute thread runs the grouped GEMM of wave i).
// T_comm and T_gemm are the standalone sums from wave-sequential at the same W; the stretched T~comm and
// T~gemm are the same operations' durations while they ran concurrently; T_overlap is the wall time of the
// overlapped schedule. Eq. 10: overlap pays only if T_overlap < T_comm + T_gemm.
//
// Communication is rowwise (SymmetricHeap put/get straight into the owner's expert-contiguous rows, every
// rank knowing every route from the shared seed); the GEMM is moe/expert_mlp's grouped SwiGLU forward. Each
// figure is the median over repeats of the max over ranks.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"
#include "expar/moe/expert_mlp.hpp"

namespace expar::cli {

namespace {

struct WavesBenchOptions {
  int ranks = 2;
  int threads = 1;        // compute threads per rank (the comm thread comes on top)
  int64_t tokens = 4096;  // per rank
  int64_t model_dim = 1024;
  int64_t hidden_dim = 2048;
  int experts = 32;
  int top_k = 4;
  std::vector<int> waves = {1, 2, 3, 4};
  int warmup = 1;
  int repeats = 3;
  uint64_t seed = 1;
  bool oversubscribe = false;
};

// Every rank's routes (identical on every rank): experts[src][t*K + k], weights summing to 1 per token.
struct Routes {
  std::vector<std::vector<int>> expert;
  std::vector<std::vector<float>> weight;
};

Routes make_routes(const WavesBenchOptions& o) {
  Routes rt;
  const auto n = static_cast<size_t>(o.ranks);
  const auto routes = static_cast<size_t>(o.tokens * o.top_k);
  rt.expert.assign(n, std::vector<int>(routes));
  rt.weight.assign(n, std::vector<float>(routes));
  for (size_t r = 0; r < n; ++r)
    for (size_t base = 0; base < routes; base += static_cast<size_t>(o.top_k)) {
      float sum = 0.0f;
      for (size_t k = 0; k < static_cast<size_t>(o.top_k); ++k) {
        int* first = &rt.expert[r][base];
        for (uint64_t attempt = 0;; ++attempt) {  // K distinct experts per token
          const int e = static_cast<int>(random_u32(o.seed, 7000 + r, (base + k) * 64 + attempt) %
                                         static_cast<uint32_t>(o.experts));
          if (std::find(first, first + k, e) == first + k) {
            first[k] = e;
            break;
          }
        }
        rt.weight[r][base + k] = 0.25f + random_uniform(o.seed, 8000 + r, base + k);
        sum += rt.weight[r][base + k];
      }
      for (size_t k = 0; k < static_cast<size_t>(o.top_k); ++k) rt.weight[r][base + k] /= sum;
    }
  return rt;
}

// One wave: tokens [t_begin, t_end) of every rank, laid out on each owner expert-major, then source rank,
// token, k (contract 3).
struct Wave {
  int64_t t_begin = 0, t_end = 0;
  std::vector<std::vector<int64_t>> row;      // [src][(t - t_begin) * K + k]: row on the owner
  std::vector<int64_t> recv_rows;             // [owner]
  std::vector<std::vector<int64_t>> offsets;  // [owner][E_L + 1]
};

std::vector<Wave> plan_waves(const WavesBenchOptions& o, const Routes& rt, int num_waves) {
  const int e_local = o.experts / o.ranks;
  const auto n = static_cast<size_t>(o.ranks);
  std::vector<Wave> waves(static_cast<size_t>(num_waves));
  for (int w = 0; w < num_waves; ++w) {
    Wave& wave = waves[static_cast<size_t>(w)];
    wave.t_begin = o.tokens * w / num_waves;
    wave.t_end = o.tokens * (w + 1) / num_waves;
    const auto routes = static_cast<size_t>((wave.t_end - wave.t_begin) * o.top_k);
    wave.row.assign(n, std::vector<int64_t>(routes, -1));
    wave.recv_rows.assign(n, 0);
    wave.offsets.assign(n, std::vector<int64_t>(static_cast<size_t>(e_local) + 1, 0));
    std::vector<std::vector<std::pair<size_t, size_t>>> by_expert(static_cast<size_t>(o.experts));
    const size_t first = static_cast<size_t>(wave.t_begin * o.top_k);
    for (size_t r = 0; r < n; ++r)
      for (size_t j = 0; j < routes; ++j)
        by_expert[static_cast<size_t>(rt.expert[r][first + j])].emplace_back(r, j);
    for (int e = 0; e < o.experts; ++e) {
      const auto p = static_cast<size_t>(e / e_local);
      for (auto [r, j] : by_expert[static_cast<size_t>(e)]) wave.row[r][j] = wave.recv_rows[p]++;
      wave.offsets[p][static_cast<size_t>(e % e_local) + 1] = wave.recv_rows[p];
    }
  }
  return waves;
}

// One schedule's figures on one rank (then max over ranks, median over repeats).
// wait: sequential: the barriers before each operation (peers catching up); overlapped: the comm thread
// waiting for GEMMs (its own rank's, then every peer's at the barrier that opens a combine).
struct Sample {
  double wall = 0, comm = 0, gemm = 0, wait = 0;
};

struct WaveRow {
  int waves = 0;
  Sample sequential, overlapped;
  bool identical = false;       // overlapped output bit-identical to wave-sequential
  double vs_no_wave_error = 0;  // max |y - y_no_wave| / max |y_no_wave|
};

class WavesBench {
 public:
  WavesBench(Comm& world, const WavesBenchOptions& o, const Routes& rt)
      : world_(world), o_(o), rt_(rt), me_(world.rank()), d_(o.model_dim) {
    const int64_t e_local = o.experts / o.ranks;
    x_ = Tensor::empty({o.tokens, d_});
    fill_normal(x_, o.seed, 9000 + static_cast<uint64_t>(me_), 1.0f);
    weights_.w1 = Tensor::empty({e_local, o.hidden_dim, d_}, DType::F32, MemCategory::ExpertWeights);
    weights_.w3 = Tensor::empty({e_local, o.hidden_dim, d_}, DType::F32, MemCategory::ExpertWeights);
    weights_.w2 = Tensor::empty({e_local, d_, o.hidden_dim}, DType::F32, MemCategory::ExpertWeights);
    fill_normal(weights_.w1, o.seed, 9100 + static_cast<uint64_t>(me_), 0.02f);
    fill_normal(weights_.w3, o.seed, 9200 + static_cast<uint64_t>(me_), 0.02f);
    fill_normal(weights_.w2, o.seed, 9300 + static_cast<uint64_t>(me_), 0.02f);
  }

  // Runs both schedules at `num_waves` (repeats interleaved, so drift hits both alike); y_out receives the
  // output of the last wave-sequential repeat.
  WaveRow run(int num_waves, std::vector<float>& y_out) {
    waves_ = plan_waves(o_, rt_, num_waves);
    // One heap per W: its buffers are sized for this wave split.
    heap_ = world_.make_heap();
    in_.clear();
    out_.clear();
    for (int w = 0; w < num_waves; ++w) {
      const auto& recv = waves_[static_cast<size_t>(w)].recv_rows;
      const int64_t rows = std::max<int64_t>(1, *std::max_element(recv.begin(), recv.end()));
      const size_t bytes = static_cast<size_t>(rows * d_) * sizeof(float);
      in_.push_back(heap_->allocate(fmt::format("waves.in.{}", w), bytes));
      out_.push_back(heap_->allocate(fmt::format("waves.out.{}", w), bytes));
    }
    int64_t max_routes = 0;
    for (const auto& wave : waves_) max_routes = std::max(max_routes, (wave.t_end - wave.t_begin) * o_.top_k);
    gathered_.assign(static_cast<size_t>(max_routes * d_), 0.0f);
    std::vector<float> y_seq(static_cast<size_t>(o_.tokens * d_)), y_ovl(y_seq.size());
    std::vector<Sample> seq, ovl;
    for (int i = 0; i < o_.warmup + o_.repeats; ++i) {
      Sample s = sequential(y_seq);
      Sample v = overlapped(y_ovl);
      if (i >= o_.warmup) {
        seq.push_back(max_over_ranks(s));
        ovl.push_back(max_over_ranks(v));
      }
    }
    WaveRow row;
    row.waves = num_waves;
    row.sequential = median(seq);
    row.overlapped = median(ovl);
    int same = std::memcmp(y_seq.data(), y_ovl.data(), y_seq.size() * sizeof(float)) == 0 ? 1 : 0;
    world_.all_reduce(&same, 1, DType::I32, ReduceOp::Sum);
    row.identical = same == world_.size();
    y_out = y_seq;
    heap_->barrier();
    heap_.reset();
    return row;
  }

 private:
  const Wave& wave(int w) const { return waves_[static_cast<size_t>(w)]; }

  // Rowwise dispatch of wave w: one put per route into the owner's expert-side row; complete on return.
  void dispatch(int w) {
    const Wave& wv = wave(w);
    const auto k = static_cast<size_t>(o_.top_k);
    const size_t first = static_cast<size_t>(wv.t_begin) * k;
    const auto& experts = rt_.expert[static_cast<size_t>(me_)];
    const auto& rows = wv.row[static_cast<size_t>(me_)];
    const int e_local = o_.experts / o_.ranks;
    const size_t row_bytes = static_cast<size_t>(d_) * sizeof(float);
    for (size_t j = 0; j < rows.size(); ++j) {
      const float* src = x_.data<float>() + (first + j) / k * static_cast<size_t>(d_);
      heap_->put(experts[first + j] / e_local, in_[static_cast<size_t>(w)],
                 static_cast<size_t>(rows[j]) * row_bytes, src, row_bytes);
    }
    heap_->barrier();
  }

  void gemm(int w) {
    const Wave& wv = wave(w);
    const int64_t rows = wv.recv_rows[static_cast<size_t>(me_)];
    Tensor input = Tensor::borrow(heap_->local(in_[static_cast<size_t>(w)]), {std::max<int64_t>(rows, 1), d_},
                                  DType::F32);
    Tensor out = Tensor::borrow(heap_->local(out_[static_cast<size_t>(w)]), {std::max<int64_t>(rows, 1), d_},
                                DType::F32);
    ExpertMlpState state;
    expert_mlp_forward(input, PayloadFormat::F32, wv.offsets[static_cast<size_t>(me_)], weights_, out, state);
  }

  // Rowwise combine of wave w: every owner's GEMM of wave w is done after the barrier (its time goes to
  // `wait`); one get per route, then each token sums its K rows in k order.
  void combine(int w, std::vector<float>& y, double& wait) {
    Timer barrier;
    heap_->barrier();
    wait += barrier.seconds();
    const Wave& wv = wave(w);
    const auto k = static_cast<size_t>(o_.top_k);
    const auto d = static_cast<size_t>(d_);
    const size_t first = static_cast<size_t>(wv.t_begin) * k;
    const auto& experts = rt_.expert[static_cast<size_t>(me_)];
    const auto& weights = rt_.weight[static_cast<size_t>(me_)];
    const auto& rows = wv.row[static_cast<size_t>(me_)];
    const int e_local = o_.experts / o_.ranks;
    for (size_t j = 0; j < rows.size(); ++j)
      heap_->get(experts[first + j] / e_local, out_[static_cast<size_t>(w)],
                 static_cast<size_t>(rows[j]) * d * sizeof(float), gathered_.data() + j * d,
                 d * sizeof(float));
    heap_->quiet();
    for (int64_t t = wv.t_begin; t < wv.t_end; ++t) {
      float* yt = y.data() + static_cast<size_t>(t) * d;
      std::fill(yt, yt + d, 0.0f);
      for (size_t kk = 0; kk < k; ++kk) {
        const size_t j = static_cast<size_t>(t - wv.t_begin) * k + kk;
        const float wgt = weights[first + j];
        const float* g = gathered_.data() + j * d;
        for (size_t c = 0; c < d; ++c) yt[c] += wgt * g[c];
      }
    }
  }

  Sample sequential(std::vector<float>& y) {
    Sample s;
    const int n = static_cast<int>(waves_.size());
    world_.barrier();
    Timer wall;
    // Each operation starts at a world barrier, so it is timed standalone: not stretched by anything else
    // and not waiting for a peer that is still in the previous operation.
    auto op = [&](double& into, auto&& fn) {
      Timer b;
      world_.barrier();
      s.wait += b.seconds();
      Timer t;
      fn();
      into += t.seconds();
    };
    for (int w = 0; w < n; ++w) {
      op(s.comm, [&] { dispatch(w); });
      op(s.gemm, [&] { gemm(w); });
      double inner = 0.0;
      op(s.comm, [&] { combine(w, y, inner); });
      s.comm -= inner;
      s.wait += inner;
    }
    s.wall = wall.seconds();
    return s;
  }

  // Comm thread: D0, D1, C0, D2, C1, ..., C(n-1) (dispatch i+1 and combine i-1 around GEMM i); this thread
  // runs the GEMMs in order as their inputs arrive.
  Sample overlapped(std::vector<float>& y) {
    Sample s;
    const int n = static_cast<int>(waves_.size());
    std::atomic<int> dispatched{0}, computed{0};
    std::atomic<bool> comm_failed{false};
    std::exception_ptr comm_error, gemm_error;
    double comm_seconds = 0.0, comm_wait = 0.0, barrier_wait = 0.0;
    MemoryTracker& tracker = current_tracker();
    world_.barrier();
    Timer wall;
    std::thread comm_thread([&] {
      TrackerBinding bind(tracker);
      try {
        auto timed = [&](auto&& fn) {
          Timer t;
          fn();
          comm_seconds += t.seconds();
        };
        auto await_gemm = [&](int w) {
          Timer t;
          for (int c = computed.load(); c <= w; c = computed.load()) computed.wait(c);
          comm_wait += t.seconds();
        };
        for (int w = 0; w < n; ++w) {
          timed([&] { dispatch(w); });
          dispatched.store(w + 1);
          dispatched.notify_one();
          if (w >= 1) {
            await_gemm(w - 1);
            timed([&] { combine(w - 1, y, barrier_wait); });
          }
        }
        await_gemm(n - 1);
        timed([&] { combine(n - 1, y, barrier_wait); });
      } catch (...) {
        comm_error = std::current_exception();  // read after join
        comm_failed.store(true);
        dispatched.store(n + 1);  // release the compute side
        dispatched.notify_one();
      }
    });
    try {
      for (int w = 0; w < n; ++w) {
        for (int c = dispatched.load(); c <= w; c = dispatched.load()) dispatched.wait(c);
        if (comm_failed.load()) break;
        Timer t;
        gemm(w);
        s.gemm += t.seconds();
        computed.store(w + 1);
        computed.notify_one();
      }
    } catch (...) {
      gemm_error = std::current_exception();
      computed.store(n + 1);  // the comm side finishes its collectives in step with its peers
      computed.notify_one();
    }
    comm_thread.join();
    s.wall = wall.seconds();
    s.comm = comm_seconds - barrier_wait;
    s.wait = comm_wait + barrier_wait;
    if (comm_error) std::rethrow_exception(comm_error);
    if (gemm_error) std::rethrow_exception(gemm_error);
    return s;
  }

  Sample max_over_ranks(const Sample& s) {
    double v[4] = {s.wall, s.comm, s.gemm, s.wait};
    world_.all_reduce(v, 4, DType::F64, ReduceOp::Max);
    return {v[0], v[1], v[2], v[3]};
  }

  static Sample median(const std::vector<Sample>& v) {
    auto med = [&](double Sample::*field) {
      std::vector<double> x;
      for (const auto& s : v) x.push_back(s.*field);
      std::sort(x.begin(), x.end());
      return x[x.size() / 2];
    };
    return {med(&Sample::wall), med(&Sample::comm), med(&Sample::gemm), med(&Sample::wait)};
  }

  Comm& world_;
  const WavesBenchOptions& o_;
  const Routes& rt_;
  int me_;
  int64_t d_;
  Tensor x_;
  ExpertWeights weights_;
  std::vector<Wave> waves_;
  std::unique_ptr<SymmetricHeap> heap_;
  std::vector<BufferId> in_, out_;
  std::vector<float> gathered_;
};

void validate(const WavesBenchOptions& o) {
  EXPAR_CHECK(o.ranks >= 1 && o.threads >= 1, "--ranks {} --threads {}: both must be at least 1", o.ranks,
              o.threads);
  EXPAR_CHECK(o.tokens >= 1 && o.model_dim >= 1 && o.hidden_dim >= 1,
              "--tokens {} --d {} --h {}: every size must be at least 1", o.tokens, o.model_dim,
              o.hidden_dim);
  EXPAR_CHECK(o.top_k >= 1 && o.top_k <= o.experts, "--top-k {} must be in [1, --experts {}]", o.top_k,
              o.experts);
  EXPAR_CHECK(o.experts % o.ranks == 0,
              "--experts {} is not divisible by --ranks {}: choose E a multiple of the ranks", o.experts,
              o.ranks);
  EXPAR_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats {} --warmup {}: need repeats >= 1, warmup >= 0",
              o.repeats, o.warmup);
  EXPAR_CHECK(!o.waves.empty(), "--waves is empty: list wave counts such as 1,2,3,4");
  for (int w : o.waves)
    EXPAR_CHECK(w >= 1 && w <= o.tokens, "--waves {}: each wave count must be in [1, --tokens {}]", w,
                o.tokens);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  EXPAR_CHECK(o.oversubscribe || static_cast<unsigned>(o.ranks * o.threads) <= cores,
              "--ranks {} x --threads {} = {} compute threads but this machine has {} cores: timings would "
              "measure the scheduler; lower --ranks or --threads, or pass --oversubscribe",
              o.ranks, o.threads, o.ranks * o.threads, cores);
}

std::string ms(double s) {
  return fmt::format("{:.1f}", s * 1e3);
}

std::string format_table(const WavesBenchOptions& o, const std::vector<WaveRow>& rows, double no_wave) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int busy = o.ranks * (o.threads + 1);
  std::string s = fmt::format(
      "expar bench waves (seed 000 §5.9, eq. 10): one MoE forward, rowwise dispatch/combine; {} ranks x {} "
      "compute thread(s), + 1 comm thread per rank when overlapped = {} threads on {} cores; T={} "
      "tokens/rank, "
      "d={}, h={}, E={}, top-{}; median of {} repeats after {} warm-up, max over ranks\n",
      o.ranks, o.threads, busy, cores, o.tokens, o.model_dim, o.hidden_dim, o.experts, o.top_k, o.repeats,
      o.warmup);
  s += fmt::format("{:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>27} {:>8} {:>5}\n",
                   "waves", "seq wall", "T_comm", "T_gemm", "T_c+T_g", "T_overlap", "~T_comm", "~T_gemm",
                   "comm x", "gemm x", "ovl wait", "eq.10: T_overlap < T_c+T_g", "/no-wave", "same");
  for (const auto& r : rows) {
    const double budget = r.sequential.comm + r.sequential.gemm;
    const double gain = budget - r.overlapped.wall;
    s += fmt::format(
        "{:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.2f} {:>7.2f} {:>8} {:>27} {:>8.3f} {:>5}\n",
        r.waves, ms(r.sequential.wall), ms(r.sequential.comm), ms(r.sequential.gemm), ms(budget),
        ms(r.overlapped.wall), ms(r.overlapped.comm), ms(r.overlapped.gemm),
        r.overlapped.comm / r.sequential.comm, r.overlapped.gemm / r.sequential.gemm, ms(r.overlapped.wait),
        fmt::format("{} by {} ({:+.1f}%)", gain > 0 ? "holds" : "FAILS", ms(std::fabs(gain)),
                    100.0 * gain / budget),
        r.overlapped.wall / no_wave, r.identical ? "yes" : "NO");
  }
  s += fmt::format(
      "  ms. T_comm, T_gemm: wave-sequential, each operation timed alone after a world barrier (seq wall "
      "adds "
      "those barriers);\n"
      "  ~T_comm, ~T_gemm: the same operations while overlapped; comm x, gemm x: the stretch ~T / T; ovl "
      "wait: "
      "the comm\n"
      "  thread waiting for GEMMs (its rank's, then its peers' at the barrier that opens a combine), not in "
      "~T_comm;\n"
      "  /no-wave: T_overlap / (T_comm + T_gemm at W=1 = {} ms); same: overlapped output bit-identical to "
      "wave-sequential.\n",
      ms(no_wave));
  // What the core count does to overlap, read from the figures above.
  double worst_gemm = 0.0, worst_comm = 0.0, best_gain = -1e300;
  int best_w = 0;
  for (const auto& r : rows)
    if (r.waves > 1) {
      worst_gemm = std::max(worst_gemm, r.overlapped.gemm / r.sequential.gemm);
      worst_comm = std::max(worst_comm, r.overlapped.comm / r.sequential.comm);
      const double gain = (r.sequential.comm + r.sequential.gemm - r.overlapped.wall) /
                          (r.sequential.comm + r.sequential.gemm);
      if (gain > best_gain) {
        best_gain = gain;
        best_w = r.waves;
      }
    }
  if (best_w > 0)
    s += fmt::format(
        "  cores: {} busy threads on {} cores ({}). Measured: GEMM stretched up to {:.2f}x and communication "
        "up "
        "to {:.2f}x when run together; best eq. 10 margin {:+.1f}% at W={}.\n",
        busy, cores,
        static_cast<unsigned>(busy) > cores
            ? "no spare core for the comm thread: it and the GEMM share a core's time"
            : "the comm thread can have a core of its own",
        worst_gemm, worst_comm, 100.0 * best_gain, best_w);
  return s;
}

std::string results_json(const WavesBenchOptions& o, const std::vector<WaveRow>& rows, double no_wave) {
  using nlohmann::json;
  json j;
  j["options"] = {{"ranks", o.ranks},
                  {"threads", o.threads},
                  {"tokens_per_rank", o.tokens},
                  {"d", o.model_dim},
                  {"h", o.hidden_dim},
                  {"experts", o.experts},
                  {"top_k", o.top_k},
                  {"repeats", o.repeats},
                  {"warmup", o.warmup},
                  {"seed", o.seed},
                  {"cores", std::max(1u, std::thread::hardware_concurrency())}};
  j["no_wave_comm_plus_gemm_seconds"] = no_wave;
  json arr = json::array();
  for (const auto& r : rows) {
    auto sample = [](const Sample& s) {
      return json{{"wall_seconds", s.wall},
                  {"comm_seconds", s.comm},
                  {"gemm_seconds", s.gemm},
                  {"wait_seconds", s.wait}};
    };
    const double budget = r.sequential.comm + r.sequential.gemm;
    arr.push_back({{"waves", r.waves},
                   {"wave_sequential", sample(r.sequential)},
                   {"wave_overlapped", sample(r.overlapped)},
                   {"eq10_holds", r.overlapped.wall < budget},
                   {"eq10_margin_seconds", budget - r.overlapped.wall},
                   {"comm_stretch", r.overlapped.comm / r.sequential.comm},
                   {"gemm_stretch", r.overlapped.gemm / r.sequential.gemm},
                   {"overlap_vs_no_wave", r.overlapped.wall / no_wave},
                   {"outputs_identical", r.identical},
                   {"max_error_vs_no_wave", r.vs_no_wave_error}});
  }
  j["waves"] = arr;
  return j.dump(2) + "\n";
}

int run_waves(WavesBenchOptions o, const std::string& json_path) {
  // W = 1 always runs first: its wave-sequential schedule is the no-wave baseline.
  std::erase(o.waves, 1);
  o.waves.insert(o.waves.begin(), 1);
  validate(o);
  const Routes rt = make_routes(o);
  std::vector<WaveRow> rows;
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.compute_threads = o.threads;
  launch.timeout_seconds = 3600;
  run_ranks(launch, [&](Comm& world) {
    WavesBench bench(world, o, rt);
    std::vector<WaveRow> mine;
    std::vector<float> y_no_wave, y;
    for (int w : o.waves) {
      mine.push_back(bench.run(w, w == 1 ? y_no_wave : y));
      if (w == 1) continue;
      // Waves change only which rows share a GEMM call, so outputs agree to rounding.
      double err = 0.0, ref = 0.0;
      for (size_t i = 0; i < y.size(); ++i) {
        err = std::max(err, std::fabs(double(y[i]) - double(y_no_wave[i])));
        ref = std::max(ref, std::fabs(double(y_no_wave[i])));
      }
      double rel = ref > 0.0 ? err / ref : 0.0;
      world.all_reduce(&rel, 1, DType::F64, ReduceOp::Max);
      mine.back().vs_no_wave_error = rel;
    }
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      rows = std::move(mine);
    }
  });
  const double no_wave = rows.front().sequential.comm + rows.front().sequential.gemm;
  fmt::print("{}", format_table(o, rows, no_wave));
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    EXPAR_CHECK(out.good(), "cannot write '{}': check the directory exists and is writable", json_path);
    out << results_json(o, rows, no_wave);
  }
  return 0;
}

}  // namespace

void add_bench_waves(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "waves", "No-wave, wave-sequential and wave-overlapped MoE forward: T_comm, T_gemm, stretch, eq. 10");
  auto o = std::make_shared<WavesBenchOptions>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--ranks", o->ranks, "ranks (threads of this process)")->check(integer_in(1, 256));
  cmd->add_option("--threads", o->threads, "compute (oneDNN) threads per rank; the comm thread is extra")
      ->check(integer_in(1, 256));
  cmd->add_option("--tokens", o->tokens, "tokens per rank")->check(integer_in(1, 1 << 20));
  cmd->add_option("--dim,--d", o->model_dim, "model dimension d")->check(integer_in(1, 1 << 16));
  cmd->add_option("--h", o->hidden_dim, "expert hidden dimension")->check(integer_in(1, 1 << 16));
  cmd->add_option("--experts", o->experts, "routed experts E")->check(integer_in(1, 4096));
  cmd->add_option("--top-k", o->top_k, "routes per token K")->check(integer_in(1, 4096));
  cmd->add_option("--waves", o->waves, "wave counts (1 = no-wave, always run)")
      ->delimiter(',')
      ->check(integer_in(1, 64));
  cmd->add_option("--repeats", o->repeats, "measured repeats (the median is shown)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", o->warmup, "warm-up repeats before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--seed", o->seed, "seed of inputs, weights and routes");
  cmd->add_flag("--oversubscribe", o->oversubscribe, "allow ranks x threads above the cores");
  cmd->add_option("--json", *json_path, "also write the figures as JSON to this file");
  table[cmd] = [o, json_path] { return run_waves(*o, *json_path); };
}

}  // namespace expar::cli
