// `expar bench payload`: dispatch and combine moving f32, bf16 and MXFP8 payload rows (issue #9, item 6).
// Each rank routes its tokens top-K over E experts sharded contiguously across the ranks; every rank builds
// every rank's routes from the same seed, so the expert-side layout (expert-major, then source rank, token,
// k: contract 3) is known everywhere without exchanging counts. Two transports on the comm layer directly:
//  - block: pack by destination, all_to_all_v of payload bytes, permute into expert-major order; combine
//    reverses it;
//  - rowwise: one put per route into the owner's expert-side slot (SymmetricHeap), and one get per route
//    back for combine.
// Per leg: encode (f32 -> payload), transfer, decode (payload -> f32; for combine fused with the weighted
// k-order sum). Each phase starts at a world barrier and is the max over ranks; the median over repeats is
// shown. The expert is the identity on the f32 reference rows, so every format's combine starts from the
// same values and each leg's error is its own: relative Frobenius error of the dispatched rows and of the
// combined output against the f32 run.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar::cli {

namespace {

struct PayloadBenchOptions {
  int ranks = 2;
  int64_t tokens = 4096;  // per rank
  int64_t model_dim = 1024;
  int experts = 32;
  int top_k = 4;
  int warmup = 1;
  int repeats = 5;
  uint64_t seed = 1;
  std::vector<std::string> formats = {"f32", "bf16", "mxfp8", "mxfp8-floor"};
  bool oversubscribe = false;
};

// Every rank's routes and where each lands; identical on every rank.
struct RouteTable {
  int ranks = 0, experts = 0, top_k = 0;
  int64_t tokens = 0;
  std::vector<std::vector<int>> expert;    // [src rank][t*K + k]
  std::vector<std::vector<float>> weight;  // [src rank][t*K + k], each token's K weights sum to 1
  std::vector<std::vector<int64_t>> row;   // [src rank][t*K + k]: row on the owner's expert side
  std::vector<int64_t> recv_rows;          // [rank]: expert-side rows
  // Block transport: [src][dst] the route ids in send order (expert, token, k), so that each source block
  // arrives expert-ordered.
  std::vector<std::vector<std::vector<int64_t>>> send_order;
  int owner(int e) const { return e / (experts / ranks); }
};

RouteTable make_routes(const PayloadBenchOptions& o) {
  RouteTable rt;
  rt.ranks = o.ranks;
  rt.experts = o.experts;
  rt.top_k = o.top_k;
  rt.tokens = o.tokens;
  const auto routes = static_cast<size_t>(o.tokens * o.top_k);
  const auto n = static_cast<size_t>(o.ranks);
  rt.expert.assign(n, std::vector<int>(routes));
  rt.weight.assign(n, std::vector<float>(routes));
  rt.row.assign(n, std::vector<int64_t>(routes, -1));
  rt.recv_rows.assign(n, 0);
  rt.send_order.assign(n, std::vector<std::vector<int64_t>>(n));
  for (size_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < o.tokens; ++t) {
      const size_t base = static_cast<size_t>(t * o.top_k);
      float sum = 0.0f;
      for (int k = 0; k < o.top_k; ++k) {
        // K distinct experts per token: redraw on a repeat.
        for (uint64_t attempt = 0;; ++attempt) {
          const int e = static_cast<int>(random_u32(o.seed, 7000 + r, (base + k) * 64 + attempt) %
                                         static_cast<uint32_t>(o.experts));
          if (std::find(&rt.expert[r][base], &rt.expert[r][base] + k, e) == &rt.expert[r][base] + k) {
            rt.expert[r][base + k] = e;
            break;
          }
        }
        rt.weight[r][base + k] = 0.25f + random_uniform(o.seed, 8000 + r, base + k);
        sum += rt.weight[r][base + k];
      }
      for (int k = 0; k < o.top_k; ++k) rt.weight[r][base + k] /= sum;
    }
  // Expert side of each owner: expert-major, then source rank, token, k.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> by_expert(static_cast<size_t>(o.experts));
  for (size_t r = 0; r < n; ++r)
    for (size_t id = 0; id < routes; ++id)
      by_expert[static_cast<size_t>(rt.expert[r][id])].emplace_back(r, id);  // already (src, t, k) ordered
  for (int e = 0; e < o.experts; ++e) {
    const auto p = static_cast<size_t>(rt.owner(e));
    for (auto [r, id] : by_expert[static_cast<size_t>(e)]) {
      rt.row[static_cast<size_t>(r)][static_cast<size_t>(id)] = rt.recv_rows[p]++;
      rt.send_order[static_cast<size_t>(r)][p].push_back(id);
    }
  }
  return rt;
}

enum Phase {
  kDispatchEncode,
  kDispatchTransfer,
  kDispatchDecode,
  kCombineEncode,
  kCombineTransfer,
  kCombineDecode,
  kNumPhases
};
const char* const kPhaseNames[kNumPhases] = {"dispatch encode", "dispatch transfer", "dispatch decode",
                                             "combine encode",  "combine transfer",  "combine decode+sum"};

struct PayloadResult {
  std::string path, format;
  size_t row_bytes = 0;
  double dispatch_bytes = 0, combine_bytes = 0;  // payload bytes sent per rank (max over ranks)
  double phases[kNumPhases] = {};                // median over repeats of the max over ranks
  double total = 0;                              // median over repeats of the sum of phases
  double dispatch_error = 0, combine_error = 0;  // relative Frobenius error vs f32, max over ranks
  double dispatch_max_error = 0;                 // max |error| / max |x| of the dispatched rows
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(got[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0.0 ? std::sqrt(num / den) : 0.0;
}

// What one rank holds while measuring: inputs, buffers and the f32 reference.
struct RankData {
  std::vector<float> x;            // [T, d]
  std::vector<float> expert_ref;   // [V, d] dispatched rows of the f32 run (= the identity expert's output)
  std::vector<float> y_ref;        // [T, d] combined output of the f32 run
  std::vector<float> expert_rows;  // [V, d] dispatched rows of the current format
  std::vector<float> y;            // [T, d]
};

class PayloadBench {
 public:
  PayloadBench(Comm& world, const PayloadBenchOptions& o, const RouteTable& rt)
      : world_(world), o_(o), rt_(rt), me_(world.rank()), d_(o.model_dim) {
    const auto n = static_cast<size_t>(o.ranks);
    routes_ = static_cast<size_t>(o.tokens * o.top_k);
    recv_ = static_cast<size_t>(rt.recv_rows[static_cast<size_t>(me_)]);
    data_.x.resize(static_cast<size_t>(o.tokens * d_));
    for (size_t i = 0; i < data_.x.size(); ++i) data_.x[i] = random_normal(o.seed, 9000 + me_, i);
    data_.expert_rows.resize(recv_ * static_cast<size_t>(d_));
    data_.y.resize(data_.x.size());
    // Block: where each received row (source-major) goes on the expert side, and where each of my routes
    // comes back in the combine receive buffer.
    for (size_t r = 0; r < n; ++r) {
      recv_counts_.push_back(rt.send_order[r][static_cast<size_t>(me_)].size());
      for (int64_t id : rt.send_order[r][static_cast<size_t>(me_)])
        recv_to_row_.push_back(rt.row[r][static_cast<size_t>(id)]);
    }
    for (size_t p = 0; p < n; ++p) send_counts_.push_back(rt.send_order[static_cast<size_t>(me_)][p].size());
    route_pos_.assign(routes_, 0);
    size_t pos = 0;
    for (size_t p = 0; p < n; ++p)
      for (int64_t id : rt.send_order[static_cast<size_t>(me_)][p])
        route_pos_[static_cast<size_t>(id)] = pos++;
    // Rowwise: symmetric buffers sized for the widest format (f32) and the largest expert side.
    max_recv_ = *std::max_element(rt.recv_rows.begin(), rt.recv_rows.end());
    heap_ = world.make_heap();
    const size_t f32_row = payload_row_bytes(PayloadFormat::F32, d_);
    dispatch_buf_ = heap_->allocate("payload.dispatch", static_cast<size_t>(max_recv_) * f32_row);
    combine_buf_ = heap_->allocate("payload.combine", static_cast<size_t>(max_recv_) * f32_row);
  }

  PayloadResult run(const std::string& path, PayloadFormat format) {
    const size_t rb = payload_row_bytes(format, d_);
    std::vector<std::byte> tokens_enc(static_cast<size_t>(o_.tokens) * rb),
        send(std::max(routes_, recv_) * rb), recv(std::max(routes_, recv_) * rb), expert_enc(recv_ * rb);
    std::vector<std::vector<double>> samples;
    for (int i = 0; i < o_.warmup + o_.repeats; ++i) {
      std::vector<double> s(kNumPhases, 0.0);
      auto phase = [&](Phase p, auto&& fn) {
        world_.barrier();
        Timer t;
        fn();
        s[p] = t.seconds();
      };
      phase(kDispatchEncode,
            [&] { encode_payload_rows(format, data_.x.data(), o_.tokens, d_, tokens_enc.data()); });
      if (path == "block") {
        phase(kDispatchTransfer, [&] { block_dispatch(rb, tokens_enc, send, recv, expert_enc); });
        phase(kDispatchDecode, [&] { decode(format, expert_enc.data(), recv_, data_.expert_rows.data()); });
        // Combine input: the f32 reference rows (identical for every format).
        const std::vector<float>& out = expert_input();
        phase(kCombineEncode, [&] { encode(format, out.data(), recv_, expert_enc.data()); });
        phase(kCombineTransfer, [&] { block_combine(rb, expert_enc, send, recv); });
        phase(kCombineDecode,
              [&] { decode_sum(format, rb, recv, [&](size_t id) { return route_pos_[id]; }); });
      } else {
        auto* dispatch_local = static_cast<std::byte*>(heap_->local(dispatch_buf_));
        auto* combine_local = static_cast<std::byte*>(heap_->local(combine_buf_));
        phase(kDispatchTransfer, [&] { rowwise_dispatch(rb, tokens_enc); });
        phase(kDispatchDecode, [&] { decode(format, dispatch_local, recv_, data_.expert_rows.data()); });
        const std::vector<float>& out = expert_input();
        phase(kCombineEncode, [&] { encode(format, out.data(), recv_, combine_local); });
        phase(kCombineTransfer, [&] { rowwise_combine(rb, recv); });
        phase(kCombineDecode, [&] { decode_sum(format, rb, recv, [](size_t id) { return id; }); });
      }
      world_.all_reduce(s.data(), s.size(), DType::F64, ReduceOp::Max);
      if (i >= o_.warmup) samples.push_back(s);
    }
    PayloadResult r;
    r.path = path;
    r.format = std::string(payload_format_name(format));
    r.row_bytes = rb;
    std::vector<double> totals;
    for (const auto& s : samples) {
      double sum = 0.0;
      for (double v : s) sum += v;
      totals.push_back(sum);
    }
    r.total = median(totals);
    for (int p = 0; p < kNumPhases; ++p) {
      std::vector<double> v;
      for (const auto& s : samples) v.push_back(s[static_cast<size_t>(p)]);
      r.phases[p] = median(v);
    }
    if (format == PayloadFormat::F32 && data_.expert_ref.empty()) {
      data_.expert_ref = data_.expert_rows;
      data_.y_ref = data_.y;
    }
    EXPAR_CHECK(!data_.expert_ref.empty(),
                "bench payload: the f32 run must come first (it is the reference)");
    double err[4] = {static_cast<double>(routes_ * rb), static_cast<double>(recv_ * rb),
                     relative_error(data_.expert_rows, data_.expert_ref),
                     relative_error(data_.y, data_.y_ref)};
    double max_err = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < data_.expert_ref.size(); ++i) {
      max_err = std::max(max_err, std::fabs(double(data_.expert_rows[i]) - double(data_.expert_ref[i])));
      max_ref = std::max(max_ref, std::fabs(double(data_.expert_ref[i])));
    }
    double max_rel = max_ref > 0.0 ? max_err / max_ref : 0.0;
    world_.all_reduce(err, 4, DType::F64, ReduceOp::Max);
    world_.all_reduce(&max_rel, 1, DType::F64, ReduceOp::Max);
    r.dispatch_bytes = err[0];
    r.combine_bytes = err[1];
    r.dispatch_error = err[2];
    r.combine_error = err[3];
    r.dispatch_max_error = max_rel;
    return r;
  }

 private:
  // The f32 reference before it exists (the f32 run itself): the rows just dispatched, which equal x.
  const std::vector<float>& expert_input() const {
    return data_.expert_ref.empty() ? data_.expert_rows : data_.expert_ref;
  }

  void encode(PayloadFormat f, const float* src, size_t rows, std::byte* dst) {
    encode_payload_rows(f, src, static_cast<int64_t>(rows), d_, dst);
  }
  void decode(PayloadFormat f, const std::byte* src, size_t rows, float* dst) {
    decode_payload_rows(f, src, static_cast<int64_t>(rows), d_, dst);
  }

  void block_dispatch(size_t rb, const std::vector<std::byte>& tokens_enc, std::vector<std::byte>& send,
                      std::vector<std::byte>& recv, std::vector<std::byte>& expert_enc) {
    size_t pos = 0;
    for (const auto& ids : rt_.send_order[static_cast<size_t>(me_)])
      for (int64_t id : ids)
        std::memcpy(send.data() + rb * pos++, tokens_enc.data() + rb * static_cast<size_t>(id / o_.top_k),
                    rb);
    std::vector<size_t> sc, rc;
    for (size_t c : send_counts_) sc.push_back(c * rb);
    for (size_t c : recv_counts_) rc.push_back(c * rb);
    world_.all_to_all_v(send.data(), sc, recv.data(), rc, DType::U8);
    for (size_t j = 0; j < recv_to_row_.size(); ++j)
      std::memcpy(expert_enc.data() + rb * static_cast<size_t>(recv_to_row_[j]), recv.data() + rb * j, rb);
  }

  void block_combine(size_t rb, const std::vector<std::byte>& expert_enc, std::vector<std::byte>& send,
                     std::vector<std::byte>& recv) {
    for (size_t j = 0; j < recv_to_row_.size(); ++j)
      std::memcpy(send.data() + rb * j, expert_enc.data() + rb * static_cast<size_t>(recv_to_row_[j]), rb);
    std::vector<size_t> sc, rc;
    for (size_t c : recv_counts_) sc.push_back(c * rb);
    for (size_t c : send_counts_) rc.push_back(c * rb);
    world_.all_to_all_v(send.data(), sc, recv.data(), rc, DType::U8);
  }

  void rowwise_dispatch(size_t rb, const std::vector<std::byte>& tokens_enc) {
    const auto& experts = rt_.expert[static_cast<size_t>(me_)];
    const auto& rows = rt_.row[static_cast<size_t>(me_)];
    for (size_t id = 0; id < routes_; ++id)
      heap_->put(rt_.owner(experts[id]), dispatch_buf_, rb * static_cast<size_t>(rows[id]),
                 tokens_enc.data() + rb * (id / static_cast<size_t>(o_.top_k)), rb);
    heap_->barrier();  // every rank's rows have landed
  }

  void rowwise_combine(size_t rb, std::vector<std::byte>& recv) {
    heap_->barrier();  // every owner's encoded expert outputs are written
    const auto& experts = rt_.expert[static_cast<size_t>(me_)];
    const auto& rows = rt_.row[static_cast<size_t>(me_)];
    for (size_t id = 0; id < routes_; ++id)
      heap_->get(rt_.owner(experts[id]), combine_buf_, rb * static_cast<size_t>(rows[id]),
                 recv.data() + rb * id, rb);
    heap_->quiet();
  }

  // y[t] = sum over k in k order of weight * decoded row; position_of(route id) = its row in `recv`.
  template <typename Position>
  void decode_sum(PayloadFormat f, size_t rb, const std::vector<std::byte>& recv, Position position_of) {
    const auto d = static_cast<size_t>(d_);
    std::vector<float> row(d);
    const auto& w = rt_.weight[static_cast<size_t>(me_)];
    for (int64_t t = 0; t < o_.tokens; ++t) {
      float* y = data_.y.data() + static_cast<size_t>(t) * d;
      std::fill(y, y + d, 0.0f);
      for (int k = 0; k < o_.top_k; ++k) {
        const size_t id = static_cast<size_t>(t * o_.top_k + k);
        decode_payload_rows(f, recv.data() + rb * position_of(id), 1, d_, row.data());
        for (size_t j = 0; j < d; ++j) y[j] += w[id] * row[j];
      }
    }
  }

  Comm& world_;
  const PayloadBenchOptions& o_;
  const RouteTable& rt_;
  int me_;
  int64_t d_;
  size_t routes_ = 0, recv_ = 0;
  int64_t max_recv_ = 0;
  RankData data_;
  std::vector<size_t> send_counts_, recv_counts_, route_pos_;
  std::vector<int64_t> recv_to_row_;
  std::unique_ptr<SymmetricHeap> heap_;
  BufferId dispatch_buf_ = 0, combine_buf_ = 0;
};

void validate(const PayloadBenchOptions& o) {
  EXPAR_CHECK(o.ranks >= 1, "--ranks {}: use at least 1", o.ranks);
  EXPAR_CHECK(o.tokens >= 1 && o.model_dim >= 1, "--tokens {} --dim {}: both must be at least 1", o.tokens,
              o.model_dim);
  EXPAR_CHECK(o.top_k >= 1 && o.top_k <= o.experts, "--top-k {} must be in [1, --experts {}]", o.top_k,
              o.experts);
  EXPAR_CHECK(o.experts % o.ranks == 0,
              "--experts {} is not divisible by --ranks {}: choose E a multiple of the ranks", o.experts,
              o.ranks);
  EXPAR_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats {} --warmup {}: need repeats >= 1, warmup >= 0",
              o.repeats, o.warmup);
  EXPAR_CHECK(!o.formats.empty(), "--formats is empty: name at least one of f32, bf16, mxfp8, mxfp8-floor");
  for (const auto& f : o.formats) payload_row_bytes(payload_format_from_name(f), o.model_dim);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  EXPAR_CHECK(o.oversubscribe || static_cast<unsigned>(o.ranks) <= cores,
              "--ranks {} (1 compute thread each) but this machine has {} cores: timings would measure the "
              "scheduler; lower --ranks or pass --oversubscribe",
              o.ranks, cores);
}

std::string format_table(const PayloadBenchOptions& o, const std::vector<PayloadResult>& results) {
  std::string s = fmt::format(
      "expar bench payload: {} ranks x 1 thread (threads backend); T={} tokens/rank, d={}, top-{} over {} "
      "experts; median of {} repeats after {} warm-up, each phase the max over ranks\n",
      o.ranks, o.tokens, o.model_dim, o.top_k, o.experts, o.repeats, o.warmup);
  s += "ms per phase; MiB = payload bytes each rank sends (dispatch + combine); errors vs the f32 run\n";
  s += fmt::format(
      "{:<8} {:<12} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>10} {:>10} {:>10}\n",
      "path", "format", "B/row", "MiB", "d.enc", "d.xfer", "d.dec", "c.enc", "c.xfer", "c.dec", "total",
      "/f32", "disp.err", "disp.max", "comb.err");
  for (const auto& r : results) {
    double f32_total = 0.0;
    for (const auto& q : results)
      if (q.path == r.path && q.format == "f32") f32_total = q.total;
    s += fmt::format("{:<8} {:<12} {:>6} {:>9.2f}", r.path, r.format, r.row_bytes,
                     (r.dispatch_bytes + r.combine_bytes) / 1048576.0);
    for (double p : r.phases) s += fmt::format(" {:>8.2f}", p * 1e3);
    s += fmt::format(" {:>9.2f} {:>7}", r.total * 1e3,
                     f32_total > 0 ? fmt::format("{:.2f}", r.total / f32_total) : "-");
    s += fmt::format(" {:>10.2e} {:>10.2e} {:>10.2e}\n", r.dispatch_error, r.dispatch_max_error,
                     r.combine_error);
  }
  s += "  d./c. = dispatch/combine; xfer: block = pack + all_to_all_v + permute to expert order (and back),\n"
       "  rowwise = one put (get) per route + heap barrier; c.dec = decode + weighted sum over k.\n"
       "  disp.err / comb.err: relative Frobenius error of the dispatched rows / combined output;\n"
       "  disp.max: max |error| / max |x| over the dispatched rows.\n";
  return s;
}

std::string results_json(const PayloadBenchOptions& o, const std::vector<PayloadResult>& results) {
  using nlohmann::json;
  json j;
  j["options"] = {
      {"ranks", o.ranks}, {"tokens_per_rank", o.tokens}, {"d", o.model_dim},   {"experts", o.experts},
      {"top_k", o.top_k}, {"repeats", o.repeats},        {"warmup", o.warmup}, {"seed", o.seed}};
  json rows = json::array();
  for (const auto& r : results) {
    json phases;
    for (int p = 0; p < kNumPhases; ++p) phases[kPhaseNames[p]] = r.phases[p];
    rows.push_back({{"path", r.path},
                    {"format", r.format},
                    {"row_bytes", r.row_bytes},
                    {"dispatch_bytes_per_rank", r.dispatch_bytes},
                    {"combine_bytes_per_rank", r.combine_bytes},
                    {"phase_seconds", phases},
                    {"total_seconds", r.total},
                    {"dispatch_relative_error", r.dispatch_error},
                    {"dispatch_max_error_over_max_abs", r.dispatch_max_error},
                    {"combine_relative_error", r.combine_error}});
  }
  j["results"] = rows;
  return j.dump(2) + "\n";
}

int run_payload(PayloadBenchOptions o, const std::string& json_path) {
  // f32 first: it is the reference of the error columns.
  std::erase(o.formats, std::string("f32"));
  o.formats.insert(o.formats.begin(), "f32");
  validate(o);
  const RouteTable rt = make_routes(o);
  std::vector<PayloadResult> results;
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.compute_threads = 1;
  launch.timeout_seconds = 3600;
  run_ranks(launch, [&](Comm& world) {
    PayloadBench bench(world, o, rt);
    std::vector<PayloadResult> mine;
    for (const char* path : {"block", "rowwise"})
      for (const auto& f : o.formats) mine.push_back(bench.run(path, payload_format_from_name(f)));
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      results = std::move(mine);
    }
  });
  fmt::print("{}", format_table(o, results));
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    EXPAR_CHECK(out.good(), "cannot write '{}': check the directory exists and is writable", json_path);
    out << results_json(o, results);
  }
  return 0;
}

}  // namespace

void add_bench_payload(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "payload",
      "Dispatch + combine moving f32, bf16 and MXFP8 payloads (block and rowwise): bytes, time, error");
  auto o = std::make_shared<PayloadBenchOptions>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--ranks", o->ranks, "ranks (threads of this process, 1 compute thread each)")
      ->check(integer_in(1, 256));
  cmd->add_option("--tokens", o->tokens, "tokens per rank")->check(integer_in(1, 1 << 20));
  cmd->add_option("--dim,--d", o->model_dim, "row width d (a multiple of 32 for the MX formats)")
      ->check(integer_in(1, 1 << 16));
  cmd->add_option("--experts", o->experts, "routed experts E (sharded contiguously over the ranks)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--top-k", o->top_k, "routes per token K")->check(integer_in(1, 4096));
  cmd->add_option("--repeats", o->repeats, "measured repeats (the median is shown)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", o->warmup, "warm-up repeats before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--seed", o->seed, "seed of inputs and routes");
  cmd->add_option("--formats", o->formats, "payload formats (f32 always runs first: the error reference)")
      ->delimiter(',');
  cmd->add_flag("--oversubscribe", o->oversubscribe, "allow more ranks than cores");
  cmd->add_option("--json", *json_path, "also write the figures as JSON to this file");
  table[cmd] = [o, json_path] { return run_payload(*o, *json_path); };
}

}  // namespace expar::cli
