// Measurement side of `expar bench paths` (see bench/paths.hpp). Every rank runs every path on the same
// inputs (x and grad_y seeded by rank), the same weights (layout-independent init) and therefore the same
// routes; each pass starts at a world barrier so that one pass's imbalance does not leak into the next.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "expar/bench/measure.hpp"
#include "expar/bench/paths.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/core/timer.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"
#include "expar/moe/router_skew.hpp"
#include "expar/topo/expert_balance.hpp"
#include "expar/topo/training_layout.hpp"
#include "expar/train/expert_replicas.hpp"

namespace expar::bench {

namespace {

// Display order: dispatch phases, expert computation, combine phases (Table 7 top to bottom).
const std::vector<std::string>& phase_order() {
  static const std::vector<std::string> order = {phase::kWait,
                                                 phase::kRouter,
                                                 phase::kRouteMap,
                                                 phase::kLocalPermute,
                                                 phase::kAllToAllDispatch,
                                                 phase::kGlobalPermute,
                                                 phase::kRowDispatch,
                                                 phase::kAllGather,
                                                 phase::kRowCopy,
                                                 phase::kGroupedGemm,
                                                 phase::kGlobalUnpermute,
                                                 phase::kAllToAllCombine,
                                                 phase::kLocalUnpermuteMerge,
                                                 phase::kRowGatherReduce,
                                                 phase::kPartialMerge,
                                                 phase::kReduceScatter};
  return order;
}

int ep_of(const PathsBenchOptions& o) {
  return o.ep == 0 ? o.ranks : o.ep;
}

MoeConfig config_of(const PathsBenchOptions& o) {
  MoeConfig c;
  c.router.num_experts = o.experts;
  c.router.top_k = o.top_k;
  c.model_dim = o.model_dim;
  c.hidden_dim = o.hidden_dim;
  c.router_bias = o.router_skew > 0;  // the skew's logit bias
  return c;
}

MoeExecution execution_of(const PathsBenchOptions& o, const std::string& path,
                          const std::vector<int>& slots) {
  MoeExecution e;
  e.path = path;
  e.precision = path_traits(path).reduced_precision ? o.precision : PayloadPrecision{};
  if (!path_traits(path).single_rank) e.slots = slots;
  return e;
}

Tensor input_of(const PathsBenchOptions& o, int rank, uint64_t stream) {
  Tensor t = Tensor::empty({o.tokens, o.model_dim});
  fill_normal(t, o.seed, stream * 1000 + static_cast<uint64_t>(rank), 1.0f);
  return t;
}

// Bytes read + written by each data-movement phase of one pass on this rank, in rows of d floats:
// R = accepted routes this rank sends, V = rows its experts receive, T = its tokens, N = the group's tokens.
// Backward passes move the same rows in the other direction, so the same counts serve both.
// Bytes read + written per phase, in rows of d floats (R routes sent, V rows received, T tokens, N group
// tokens). Backward (the adjoint named after its forward phase) differs where the adjoint sums routes into
// tokens in place: permute / row dispatch backward read R route-gradient rows and write T (R+T, not 2R);
// unpermute + merge and row gather backward read T gradient rows and R saved rows and write R (2R+T).
// With reduced-precision payloads every row of a dispatch or combine phase counts at its leg's encoded size
// (the f32 side of the encode and decode is not counted, so the fraction of the limit is a lower bound).
std::map<std::string, double> phase_bytes(const RouteMap& map, int64_t d, bool forward,
                                          const PayloadPrecision& precision) {
  int64_t r = 0, n = 0;
  for (int64_t c : map.send_counts) r += c;
  for (int64_t t : map.tokens_per_source) n += t;
  if (map.ep_size == 1) r = map.recv_rows;
  const int64_t v = map.recv_rows, t = map.tokens;
  std::map<std::string, double> rows{
      {phase::kLocalPermute, 2.0 * r},
      {phase::kAllToAllDispatch, 1.0 * (r + v)},
      {phase::kGlobalPermute, 2.0 * v},
      {phase::kRowDispatch, 2.0 * r},
      {phase::kAllGather, 1.0 * (t + n)},
      {phase::kRowCopy, 2.0 * v},
      {phase::kGlobalUnpermute, 2.0 * v},
      {phase::kAllToAllCombine, 1.0 * (r + v)},
      // local path: no scatter, the merge reads the expert side in place (R
      // rows read, T written)
      {phase::kLocalUnpermuteMerge, map.ep_size == 1 ? 1.0 * (r + t) : 3.0 * r + t},
      {phase::kRowGatherReduce, 3.0 * r + t},
      {phase::kPartialMerge, 1.0 * (v + n)},
      {phase::kReduceScatter, 1.0 * (n + t)}};
  if (!forward) {
    rows[phase::kLocalPermute] = 1.0 * (r + t);
    rows[phase::kRowDispatch] = 1.0 * (r + t);
    rows[phase::kLocalUnpermuteMerge] = 2.0 * r + t;
    rows[phase::kRowGatherReduce] = 2.0 * r + t;
  }
  const PayloadFormat dispatch_leg = forward ? precision.dispatch : precision.dispatch_grad;
  const PayloadFormat combine_leg = forward ? precision.combine : precision.combine_grad;
  std::map<std::string, double> bytes;
  for (const auto& [name, count] : rows) {
    PayloadFormat leg = PayloadFormat::F32;
    if (name == phase::kLocalPermute || name == phase::kAllToAllDispatch || name == phase::kGlobalPermute ||
        name == phase::kRowDispatch)
      leg = dispatch_leg;
    if (name == phase::kGlobalUnpermute || name == phase::kAllToAllCombine ||
        name == phase::kLocalUnpermuteMerge || name == phase::kRowGatherReduce)
      leg = combine_leg;
    bytes[name] = count * static_cast<double>(payload_row_bytes(leg, d));
  }
  return bytes;
}

// The limit's matmul, in the expert MLP's orientation: x [rows, d] times w1ᵀ ([h, d] stored); with
// --precision bf16 the BF16 product (BF16 copies of the same values) the grouped GEMM runs.
class LimitMatmul {
 public:
  LimitMatmul(const PathsBenchOptions& o, int64_t rows)
      : o_(o),
        rows_(rows),
        a_(Tensor::empty({rows, o.model_dim}, DType::F32, MemCategory::Other)),
        w_(Tensor::empty({o.hidden_dim, o.model_dim}, DType::F32, MemCategory::Other)),
        c_(Tensor::empty({rows, o.hidden_dim}, DType::F32, MemCategory::Other)) {
    fill_normal(a_, o.seed, 9001, 1.0f);
    fill_normal(w_, o.seed, 9002, 1.0f);
    if (o.bf16_products) {
      a_ = to_bf16(a_, MemCategory::Other);
      w_ = to_bf16(w_, MemCategory::Other);
    }
  }
  // Seconds of the slowest rank for one product: the faster of two back to back. Timed once after each step,
  // the local path's limit read well below the EP paths' in the same runs (docs/performance.md, "How `bench
  // paths` measures"); likely (not measured directly) the first product writes back what the step left
  // dirty in the caches, and the local path's step, holding every expert's weight gradients, leaves the most.
  double seconds(Comm& world) {
    auto once = [&] {
      return timed_max(world, [&] {
        if (o_.bf16_products)
          matmul_bf16({.a = static_cast<const uint16_t*>(a_.raw()),
                       .b = static_cast<const uint16_t*>(w_.raw()),
                       .c = c_.data<float>(),
                       .m = rows_,
                       .n = o_.hidden_dim,
                       .k = o_.model_dim,
                       .trans_b = true});
        else
          matmul(a_.data<float>(), w_.data<float>(), c_.data<float>(), rows_, o_.hidden_dim, o_.model_dim,
                 false, true, false);
      });
    };
    const double first = once();
    return std::min(first, once());
  }
  double flops(double seconds) const {
    return 2.0 * static_cast<double>(rows_) * static_cast<double>(o_.model_dim) *
           static_cast<double>(o_.hidden_dim) / seconds;
  }

 private:
  const PathsBenchOptions& o_;
  int64_t rows_;
  Tensor a_, w_, c_;
};

// (collectives, one-sided) traffic of one step, summed over the world's ranks.
std::pair<TrafficStats, TrafficStats> step_traffic(Comm& world, const TrafficStats& collective,
                                                   const SymmetricHeap::Stats& heap) {
  TrafficStats one_sided = heap.puts;
  one_sided += heap.gets;
  std::vector<int64_t> v;
  for (const TrafficStats* t : {&collective, static_cast<const TrafficStats*>(&one_sided)})
    v.insert(v.end(),
             {t->intra_node_messages, t->intra_node_bytes, t->inter_node_messages, t->inter_node_bytes});
  world.all_reduce(v.data(), v.size(), DType::I64, ReduceOp::Sum);
  auto at = [&](size_t i) { return TrafficStats{v[i], v[i + 1], v[i + 2], v[i + 3]}; };
  return {at(0), at(4)};
}

PathResult measure_one(Comm& world, Comm& group, const PathsBenchOptions& o, const std::string& path,
                       const std::vector<int>& slots, const Tensor& x, const Tensor& grad_y,
                       int64_t& recv_rows_out, int64_t& send_rows_out) {
  // The layer's heap (the rowwise path's), made here so that its one-sided traffic can be read.
  auto heap = group.make_heap();
  const std::unique_ptr<MoeLayer> made = make_bench_layer(group, o, path, slots, heap.get());
  MoeLayer& layer = *made;
  const auto& order = phase_order();
  const size_t p = order.size();
  // Per repeat: [forward total, backward total, forward phases..., backward phases...], max over ranks.
  std::vector<std::vector<double>> samples;
  std::map<std::string, double> bytes;
  RouteMap last_map;
  std::optional<LimitMatmul> limit;
  int64_t limit_rows = 0;
  std::vector<double> limit_samples;
  std::pair<TrafficStats, TrafficStats> traffic;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    PhaseTimer forward_timer, backward_timer;
    forward_timer.set_sync_comm(o.sync_comm);
    backward_timer.set_sync_comm(o.sync_comm);
    std::vector<double> sample(2 + 2 * p, 0.0);
    group.reset_stats();
    heap->reset_stats();
    {
      MoeState state;
      // A training step's: its gradients start at zero, so the expert backward writes them
      // (MoeLayer::zero_grads).
      layer.zero_grads();
      world.barrier();
      Timer t;
      {
        PhaseTimerBinding bind(&forward_timer);
        layer.forward(x, state);
      }
      sample[0] = t.seconds();
      world.barrier();
      t.reset();
      {
        PhaseTimerBinding bind(&backward_timer);
        layer.backward(grad_y, state);
      }
      sample[1] = t.seconds();
      if (i == 0) last_map = state.routes;
    }
    if (i == 0) traffic = step_traffic(world, group.stats().traffic, heap->stats());
    for (size_t j = 0; j < p; ++j) {
      sample[2 + j] = forward_timer.seconds(order[j]);
      sample[2 + p + j] = backward_timer.seconds(order[j]);
    }
    world.all_reduce(sample.data(), sample.size(), DType::F64, ReduceOp::Max);
    if (i >= o.warmup) samples.push_back(std::move(sample));
    // The grouped GEMM's limit, timed between this path's repeats at its rows: the machine's speed drifts
    // over a run (on a shared VM by large factors between two paths of one run; docs/performance_history.md,
    // "Small experts, 2026-12-01"), so a limit timed once at the end of the run would be compared with
    // phases timed at other speeds.
    if (!limit) {
      int64_t rows = std::max<int64_t>(last_map.recv_rows, 1);
      world.all_reduce(&rows, 1, DType::I64, ReduceOp::Max);
      limit.emplace(o, rows);
      limit_rows = rows;
    }
    const double t = limit->seconds(world);
    if (i >= o.warmup) limit_samples.push_back(t);
  }
  PathResult r;
  r.path = path;
  r.collective_traffic = traffic.first;
  r.one_sided_traffic = traffic.second;
  auto med = [&](size_t index) {
    std::vector<double> v;
    for (const auto& s : samples) v.push_back(s[index]);
    return median(v);
  };
  r.matmul_rows = limit_rows;
  r.matmul_flops = limit->flops(median(limit_samples));
  r.forward.total = med(0);
  r.backward.total = med(1);
  for (size_t j = 0; j < p; ++j) {
    // A phase this path has: recorded (> 0) on some rank in some repeat.
    bool seen_f = false, seen_b = false;
    for (const auto& s : samples) {
      seen_f = seen_f || s[2 + j] > 0.0;
      seen_b = seen_b || s[2 + p + j] > 0.0;
    }
    if (seen_f) r.forward.phases.emplace_back(order[j], med(2 + j));
    if (seen_b) r.backward.phases.emplace_back(order[j], med(2 + p + j));
  }
  // Bytes and GEMM work of the slowest rank (max over ranks).
  const PayloadPrecision precision = layer.execution().precision;
  auto b = phase_bytes(last_map, o.model_dim, true, precision);
  auto bb = phase_bytes(last_map, o.model_dim, false, precision);
  std::vector<double> work;
  for (const auto& name : order) work.push_back(b.count(name) ? b[name] : 0.0);
  for (const auto& name : order) work.push_back(bb.count(name) ? bb[name] : 0.0);
  const double rows = static_cast<double>(last_map.recv_rows);
  const double gemm = 2.0 * rows * static_cast<double>(o.model_dim) * static_cast<double>(o.hidden_dim);
  work.push_back(3 * gemm);
  work.push_back(6 * gemm);
  int64_t moved = 0;
  for (int64_t c : last_map.send_counts) moved += c;
  if (last_map.ep_size == 1) moved = last_map.recv_rows;
  work.push_back(static_cast<double>(moved));
  const PayloadFormat legs[4] = {precision.dispatch, precision.combine, precision.combine_grad,
                                 precision.dispatch_grad};
  for (PayloadFormat leg : legs)
    work.push_back(static_cast<double>(moved) * static_cast<double>(payload_row_bytes(leg, o.model_dim)));
  world.all_reduce(work.data(), work.size(), DType::F64, ReduceOp::Max);
  r.routes_moved = static_cast<int64_t>(work[2 * p + 2]);
  for (int l = 0; l < 4; ++l) r.payload_bytes[l] = work[2 * p + 3 + static_cast<size_t>(l)];
  for (size_t j = 0; j < p; ++j) {
    if (work[j] > 0.0) r.bytes[order[j]] = work[j];
    if (work[p + j] > 0.0) r.bytes_backward[order[j]] = work[p + j];
  }
  r.gemm_flops_forward = work[2 * p];
  r.gemm_flops_backward = work[2 * p + 1];
  std::vector<double> rank_rows(static_cast<size_t>(group.size()));
  const auto mine = static_cast<double>(last_map.recv_rows);
  group.all_gather(&mine, rank_rows.data(), 1, DType::F64);
  r.rank_load_imbalance = load_imbalance(rank_rows);
  world.all_reduce(&r.rank_load_imbalance, 1, DType::F64, ReduceOp::Max);
  recv_rows_out = last_map.recv_rows;
  int64_t sent = 0;
  for (int64_t c : last_map.send_counts) sent += c;
  send_rows_out = last_map.ep_size == 1 ? last_map.recv_rows : sent;
  return r;
}

Limits measure_limits(Comm& world, const PathsBenchOptions& o, int64_t gemm_rows, int64_t copy_rows) {
  Limits l;
  int64_t rows = std::max<int64_t>(gemm_rows, 1);
  world.all_reduce(&rows, 1, DType::I64, ReduceOp::Max);
  l.matmul_rows = rows;
  {
    LimitMatmul probe(o, rows);
    std::vector<double> s;
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      const double t = probe.seconds(world);
      if (i >= o.warmup) s.push_back(t);
    }
    l.matmul_flops = probe.flops(median(s));
  }
  {
    int64_t bytes = std::max<int64_t>(copy_rows * o.model_dim * static_cast<int64_t>(sizeof(float)), 1 << 20);
    world.all_reduce(&bytes, 1, DType::I64, ReduceOp::Max);
    l.memcpy_bytes = bytes;
    std::vector<std::byte> src(static_cast<size_t>(bytes), std::byte{1}), dst(static_cast<size_t>(bytes));
    std::memset(dst.data(), 0, dst.size());
    std::vector<double> s;
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      const double t = timed_max(world, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
      if (i >= o.warmup) s.push_back(t);
    }
    l.memcpy_bandwidth = 2.0 * static_cast<double>(bytes) / median(s);
  }
  return l;
}

}  // namespace

std::vector<int> measured_expert_slots(Comm& world, const PathsBenchOptions& o) {
  if (o.redundant_experts == 0) return {};
  const MoeConfig config = config_of(o);
  Tensor w_router = Tensor::empty({o.experts, o.model_dim}, DType::F32, MemCategory::Other);
  init_router_weight(w_router, "bench", o.seed);
  const Tensor skew = router_skew_bias(o.router_skew, o.experts, o.seed, 0);  // the one MoE layer timed
  RouterState state;
  const RouterOutput routed =
      router_forward(config.router, input_of(o, world.rank(), 3), w_router, nullptr, state, &skew);
  std::vector<int64_t> counts = routed.expert_counts;
  world.all_reduce(std::span<int64_t>(counts), ReduceOp::Sum);
  ExpertBalanceInput in;
  in.loads.assign(counts.begin(), counts.end());
  in.redundant = o.redundant_experts;
  in.ep_size = ep_of(o);
  in.ranks_per_node = o.ranks_per_node;
  std::vector<int> table;
  for (const PhysicalSlot& slot : balance_experts(in).slots) table.push_back(slot.expert);
  return table;
}

std::unique_ptr<MoeLayer> make_bench_layer(Comm& group, const PathsBenchOptions& o, const std::string& path,
                                           const std::vector<int>& slots, SymmetricHeap* heap) {
  auto layer = std::make_unique<MoeLayer>(config_of(o), execution_of(o, path, slots), group, "bench",
                                          MoeSharedResources{heap, nullptr, -1});
  layer->init_params(o.seed);
  if (o.router_skew > 0)
    layer->params().router_bias = router_skew_bias(o.router_skew, o.experts, o.seed, 0);  // layer 0's
  // With --precision bf16 the experts multiply from BF16 copies of their f32 masters (made once: the
  // weights do not change between repeats).
  if (o.bf16_products) refresh_bf16_copies(layer->params().experts);
  return layer;
}

double PassTimes::phase_seconds(const std::string& name) const {
  for (const auto& [n, s] : phases)
    if (n == name) return s;
  return 0.0;
}

double PassTimes::dispatch_combine() const {
  double sum = 0.0;
  for (const auto& [n, s] : phases)
    if (n != phase::kRouter && n != phase::kGroupedGemm && n != phase::kWait) sum += s;
  return sum;
}

const PathResult* PathsReport::find(const std::string& path) const {
  for (const auto& r : results)
    if (r.path == path) return &r;
  return nullptr;
}

PhaseKind phase_kind(const std::string& name) {
  if (name == phase::kRouter) return PhaseKind::Router;
  if (name == phase::kWait) return PhaseKind::Wait;
  if (name == phase::kRouteMap) return PhaseKind::RouteMap;
  if (name == phase::kGroupedGemm) return PhaseKind::Compute;
  if (name == phase::kAllToAllDispatch || name == phase::kAllToAllCombine || name == phase::kAllGather ||
      name == phase::kReduceScatter)
    return PhaseKind::Collective;
  if (name == phase::kRowDispatch || name == phase::kRowGatherReduce) return PhaseKind::Rowwise;
  return PhaseKind::Layout;
}

double gemm_limit(const PathsReport& report, const PathResult& r) {
  return r.matmul_flops > 0.0 ? r.matmul_flops : report.limits.matmul_flops;
}

double limit_fraction(const PathsReport& report, const PathResult& r, const std::string& name, bool forward) {
  const PassTimes& pass = forward ? r.forward : r.backward;
  const double seconds = pass.phase_seconds(name);
  if (seconds <= 0.0) return 0.0;
  const PhaseKind kind = phase_kind(name);
  if (kind == PhaseKind::Compute) {
    const double flops = forward ? r.gemm_flops_forward : r.gemm_flops_backward;
    const double limit = gemm_limit(report, r);
    return limit > 0.0 ? flops / limit / seconds : 0.0;
  }
  if (kind == PhaseKind::Router || kind == PhaseKind::RouteMap || kind == PhaseKind::Wait) return 0.0;
  const auto& bytes = r.bytes_of(forward);
  auto it = bytes.find(name);
  if (it == bytes.end() || report.limits.memcpy_bandwidth <= 0.0) return 0.0;
  return it->second / report.limits.memcpy_bandwidth / seconds;
}

void validate(const PathsBenchOptions& o, int local_ranks) {
  validate_setup(o);
  if (o.bf16_products) check_bf16_native("expar bench paths --precision bf16");
  EXPAR_CHECK(o.transport == "threads" || o.transport == "mpi",
              "--transport '{}' is unknown: use threads (default) or mpi (under mpirun)", o.transport);
  check_emulated_nodes(o.ranks_per_node, o.ranks, o.transport);
  const int ep = ep_of(o);
  // The EP degrees the training layout accepts with these ranks and experts (its own rules, run over the
  // candidates), so that a suggested --ep is accepted.
  std::vector<int> eps;
  for (int m = 1; m <= o.ranks; ++m) {
    TrainingLayoutConfig lc{o.ranks, m};
    lc.num_experts = o.experts;
    if (!training_layout_refusal(lc)) eps.push_back(m);
  }
  EXPAR_CHECK(ep >= 1 && o.ranks % ep == 0, "--ep {} does not divide --ranks {}: choose --ep in {{{}}}", ep,
              o.ranks, fmt::join(eps, ","));
  check_router_skew(o.router_skew);
  if (o.redundant_experts != 0) {
    check_redundant_experts(o.experts, o.redundant_experts, ep, o.ranks, 1);
  } else {
    EXPAR_CHECK(
        o.experts % ep == 0,
        "--experts {} is not divisible by the EP degree {}: choose --experts a multiple of {}, or --ep "
        "in {{{}}}",
        o.experts, ep, ep, fmt::join(eps, ","));
  }
  o.precision.validate(o.model_dim);
  const std::vector<std::string> known = benchmarked_paths({});
  for (const auto& p : o.paths) {
    EXPAR_CHECK(std::find(known.begin(), known.end(), p) != known.end(),
                "--paths: unknown path '{}': choose from {}", p, fmt::join(known, ", "));
    EXPAR_CHECK(o.precision.all_f32() || path_traits(p).reduced_precision,
                "--paths {}: path '{}' moves f32 rows only, but the payload precision is {}: pass --paths {} "
                "with a reduced precision (or leave --paths out)",
                fmt::join(o.paths, ","), p, o.precision.describe(),
                fmt::join(benchmarked_paths(o.precision), ","));
  }
  check_cores(local_ranks > 0 ? local_ranks : o.ranks, o.threads, o.oversubscribe);
}

std::vector<std::string> benchmarked_paths(const PayloadPrecision& precision) {
  std::vector<std::string> names;
  for (const PathTraits& t : path_registry())
    if (!t.decode_form && (precision.all_f32() || t.reduced_precision)) names.push_back(t.name);
  return names;
}

void run_on_ranks(const PathsBenchOptions& o,
                  const std::function<void(Comm& world, const PathsBenchOptions& run)>& fn) {
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.ranks_per_node = o.ranks_per_node;
  launch.compute_threads = o.threads;
  launch.timeout_seconds = 3600;
  if (o.transport != "mpi") {
    validate(o);
    run_ranks(launch, [&](Comm& world) { fn(world, o); });
    return;
  }
  // Emulated nodes are refused before MPI starts (every process would print the same error otherwise).
  check_emulated_nodes(o.ranks_per_node, o.ranks, o.transport);
  run_mpi(nullptr, nullptr, launch, [&](Comm& world) {
    PathsBenchOptions run = o;
    run.ranks = world.size();
    // The cores a rank competes for are those of its node: the ranks MPI placed there.
    const auto& node_of = world.nodes().node_of;
    const int local = static_cast<int>(std::count(node_of.begin(), node_of.end(), world.node()));
    validate(run, local);
    fn(world, run);
  });
}

PathsReport measure_paths(Comm& world, const PathsBenchOptions& o) {
  PathsReport report;
  report.options = o;
  report.options.ep = ep_of(o);
  report.nodes = world.nodes();
  const int ep = report.options.ep;
  const int rank = world.rank();
  auto ep_group = world.split(rank / ep, rank, "ep");
  auto solo = world.split(rank, 0, "solo");
  const std::vector<int> slots = measured_expert_slots(world, o);
  const Tensor x = input_of(o, rank, 1);
  const Tensor grad_y = input_of(o, rank, 2);
  int64_t gemm_rows = 0, copy_rows = 0;
  for (const auto& path : o.paths) {
    Comm& group = path_traits(path).single_rank ? *solo : *ep_group;
    int64_t recv = 0, sent = 0;
    report.results.push_back(measure_one(world, group, o, path, slots, x, grad_y, recv, sent));
    gemm_rows = std::max(gemm_rows, recv);
    copy_rows = std::max(copy_rows, sent);
  }
  report.limits = measure_limits(world, o, gemm_rows, copy_rows);
  return report;
}

PathsReport measure_paths(const PathsBenchOptions& o) {
  PathsReport report;
  std::mutex mutex;
  run_on_ranks(o, [&](Comm& world, const PathsBenchOptions& run) {
    PathsReport mine = measure_paths(world, run);
    std::lock_guard lock(mutex);
    if (world.rank() == 0 || run.transport == "mpi") report = std::move(mine);
  });
  return report;
}

std::vector<MemoryRow> measure_memory(Comm& world, const PathsBenchOptions& o) {
  const int ep = ep_of(o);
  const int rank = world.rank();
  const std::vector<int> slots = measured_expert_slots(world, o);
  // The no-EP row on world rank 0 alone, each EP row on the EP group of world rank 0 (ranks [0, ep)).
  auto solo = world.split(rank == 0 ? 0 : 1, rank, "memory.solo");
  auto ep_group = world.split(rank < ep ? 0 : 1, rank, "memory.ep");
  std::vector<MemoryRow> rows;
  auto run = [&](const std::string& path, Comm* group, int ranks, const std::string& label) {
    MemoryTracker tracker;
    if (group != nullptr) {
      TrackerBinding binding(tracker);
      const std::unique_ptr<MoeLayer> made = make_bench_layer(*group, o, path, slots);
      MoeLayer& layer = *made;
      const Tensor x = input_of(o, rank, 1);
      const Tensor grad_y = input_of(o, rank, 2);
      MoeState state;
      layer.forward(x, state);
      layer.backward(grad_y, state);
    }
    const MemorySnapshot mine = tracker.snapshot();
    std::vector<int64_t> peak(mine.peak.begin(), mine.peak.end());
    peak.push_back(mine.total_peak);
    world.all_reduce(peak.data(), peak.size(), DType::I64, ReduceOp::Max);
    MemoryRow row;
    row.label = label;
    row.ranks = ranks;
    std::copy(peak.begin(), peak.begin() + kNumMemCategories, row.peak.peak.begin());
    row.peak.total_peak = peak.back();
    rows.push_back(row);
  };
  run("local", rank == 0 ? solo.get() : nullptr, 1, "no EP (local, all experts)");
  if (ep > 1)
    for (const auto& p : o.paths)
      if (!path_traits(p).single_rank)
        run(p, rank < ep ? ep_group.get() : nullptr, ep, fmt::format("EP{} {}", ep, p));
  return rows;
}

std::vector<MemoryRow> measure_memory(const PathsBenchOptions& o) {
  std::vector<MemoryRow> rows;
  std::mutex mutex;
  run_on_ranks(o, [&](Comm& world, const PathsBenchOptions& run) {
    std::vector<MemoryRow> mine = measure_memory(world, run);
    std::lock_guard lock(mutex);
    if (world.rank() == 0 || run.transport == "mpi") rows = std::move(mine);
  });
  return rows;
}

}  // namespace expar::bench
