// The `block` path: conventional block all-to-all EP (seed 000 §5.3, Figure 15, the left side of Table 7).
//
//   dispatch: local permute (accepted routes sorted by destination rank, then by dst_row, into one
//             peer-contiguous send buffer) -> all_to_all_v with host split lists (the route map's
//             send_counts / recv_counts, from the gathered count matrix) -> global permute (received
//             source-rank blocks into local-expert order, exactly the rows dst_row names: contract 3).
//   combine:  global unpermute (expert order back into source-rank blocks) -> reverse all_to_all_v ->
//             local unpermute (each route's row back to (t, k)) -> merge_routes (k order, dropped = 0).
// Backward runs the same movements with the split lists swapped: combine backward moves w·grad_y rows
// source -> expert like dispatch forward; dispatch backward moves grad rows expert -> source like combine.
// The packed peer buffers are communication scratch (MemCategory::CommScratch), so memory reports show
// what this path costs over rowwise.
// Payload precision (PathOptions::precision): every leg moves byte rows of payload_row_bytes(format, d).
// Dispatch encodes each token row once in the local permute and keeps the received rows encoded as the
// expert-side input (the expert MLP decodes them); combine encodes the expert outputs in the global
// unpermute and decodes them in the local unpermute; backward likewise. The f32 rows move unchanged.
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/phase_timer.hpp"
#include "expar/moe/waves.hpp"

namespace expar {

namespace {

// One wave's part of a step's layout, derived from the route map once in dispatch_forward_begin and reused
// by every later pass of the step (the route map is saved for backward, so is this). Without waves the step
// has one part covering every local expert.
struct WavePlan {
  // Routes (t*K + k) of this wave in send-buffer order: by destination rank, then dst_row.
  std::vector<int64_t> send_order;
  // Split lists in rows, indexed by peer.
  std::vector<size_t> send_counts, recv_counts;
  // Global permute as block copies: rows [recv_begin, recv_begin + rows) of this wave's receive buffer are
  // rows [expert_begin, expert_begin + rows) of the expert-side buffer (one run per (source, local expert)).
  struct Run {
    int64_t recv_begin = 0, expert_begin = 0, rows = 0;
  };
  std::vector<Run> runs;
  int64_t send_rows = 0, recv_rows = 0;
};

// What one step keeps between its passes.
struct BlockStep {
  std::vector<WavePlan> waves;
  int64_t d = 0;
  Tensor expert_in;  // dispatch forward's expert-side rows (encoded with a non-f32 dispatch)
  Tensor encoded_x;  // a non-f32 dispatch: each token row encoded once, until the last wave is sent
  Tensor gathered;   // combine forward: [T, K, d] expert outputs at each route's (t, k)
  Tensor grad_out;   // combine backward: the expert-output gradient rows in expert order
  std::vector<Tensor> grad_recv;  // dispatch backward: each wave's received f32 gradient rows
};

std::vector<WavePlan> make_plan(const RouteMap& map, const ExpertPlacement& placement,
                                std::span<const ExpertWave> wave_split) {
  const int m = map.ep_size;
  const WaveRoutes wr = make_wave_routes(map, placement, wave_split);
  std::vector<int64_t> order;
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k)
      if (map.valid(t, k)) order.push_back(t * map.top_k + k);
  const int32_t* rank = map.dst_rank.data<int32_t>();
  const int32_t* row = map.dst_row.data<int32_t>();
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return rank[a] != rank[b] ? rank[a] < rank[b] : row[a] < row[b]; });
  std::vector<WavePlan> plans(static_cast<size_t>(wr.waves));
  for (WavePlan& p : plans) {
    p.send_counts.assign(static_cast<size_t>(m), 0);
    p.recv_counts.assign(static_cast<size_t>(m), 0);
  }
  if (wr.waves == 1) {
    plans[0].send_order = std::move(order);
  } else {
    for (int64_t route : order)
      plans[static_cast<size_t>(wr.wave_of[static_cast<size_t>(route)])].send_order.push_back(route);
  }
  for (WavePlan& p : plans) {
    p.send_rows = static_cast<int64_t>(p.send_order.size());
    for (int64_t route : p.send_order) ++p.send_counts[static_cast<size_t>(rank[route])];
  }
  // Source s's block of a wave holds its routes to this rank sorted by dst_row, i.e. for each local expert
  // of the wave in order its accepted rows, which land after the rows of the sources before s (contract 3).
  const std::vector<int> local = placement.local_slots(map.ep_rank);
  const ExpertWave all[] = {{0, static_cast<int>(local.size())}};
  if (wave_split.empty()) wave_split = all;
  int64_t total = 0;
  for (size_t w = 0; w < plans.size(); ++w) {
    WavePlan& p = plans[w];
    int64_t recv_begin = 0;
    for (int s = 0; s < m; ++s) {
      for (int l = wave_split[w].begin; l < wave_split[w].end; ++l) {
        const int e = local[static_cast<size_t>(l)];
        int64_t before = 0;
        for (int q = 0; q < s; ++q) before += map.accepted_of(q, e);
        const int64_t rows = map.accepted_of(s, e);
        if (rows > 0)
          p.runs.push_back({recv_begin, map.expert_offsets[static_cast<size_t>(l)] + before, rows});
        recv_begin += rows;
        p.recv_counts[static_cast<size_t>(s)] += static_cast<size_t>(rows);
      }
    }
    p.recv_rows = recv_begin;
    total += recv_begin;
  }
  EXPAR_ASSERT(total == map.recv_rows,
               "block path: the accepted matrix gives rank {} {} rows but the route map says {}", map.ep_rank,
               total, map.recv_rows);
  return plans;
}

class BlockPath final : public ExpertPath {
 public:
  BlockPath(Comm& ep_group, const PathOptions& options) : group_(ep_group), options_(options) {}

  std::string name() const override { return "block"; }

  // The single-call passes are the wave passes over one wave of every expert.
  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    state.waves.clear();
    Tensor in = dispatch_forward_begin(x, map, state);
    dispatch_forward_wave(x, map, state, 0);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    combine_forward_wave(expert_out, map, state, 0);
    return combine_forward_end(topk_weight, map, state);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    Tensor grad_out = combine_backward_begin(grad_y, topk_weight, map, state, grad_topk_weight);
    combine_backward_wave(grad_y, topk_weight, map, state, 0);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    dispatch_backward_wave(grad_expert_in, map, state, 0);
    return dispatch_backward_end(map, state);
  }

  Tensor dispatch_forward_begin(const Tensor& x, const RouteMap& map, PathState& state) override {
    check_map(map, x, "dispatch forward");
    const int64_t d = x.dim(1);
    const PayloadFormat format = options_.precision.dispatch;
    PhaseScope permute_phase(phase::kLocalPermute);  // the plan's sort is part of the local permute
    auto step = std::make_shared<BlockStep>();
    step->waves = make_plan(map, *options_.placement, state.waves);
    step->d = d;
    state.path_data = step;
    // A reduced-precision row is encoded once per token, then replicated into each wave's send buffer.
    if (format != PayloadFormat::F32) {
      step->encoded_x = Tensor::empty({map.tokens, static_cast<int64_t>(payload_row_bytes(format, d))},
                                      DType::U8, MemCategory::CommScratch);
      encode_rows(format, x.data<float>(), map.tokens, d, static_cast<std::byte*>(step->encoded_x.raw()));
    }
    step->expert_in = payload_tensor(format, map.capacity_rows, d);
    return step->expert_in;
  }

  void dispatch_forward_wave(const Tensor& x, const RouteMap& map, PathState& state, int wave) override {
    BlockStep& step = step_of(state, "dispatch forward");
    const WavePlan& plan = wave_of(step, wave);
    const int64_t d = x.dim(1);
    const PayloadFormat format = options_.precision.dispatch;
    const size_t rb = payload_row_bytes(format, d);
    // Local permute: replicate each token row once per accepted route, packed by destination rank.
    PhaseScope permute_phase(phase::kLocalPermute);
    const std::byte* src = format == PayloadFormat::F32 ? static_cast<const std::byte*>(x.raw())
                                                        : static_cast<const std::byte*>(step.encoded_x.raw());
    Tensor send = byte_rows(plan.send_rows, rb);
    auto* packed = static_cast<std::byte*>(send.raw());
    for (int64_t i = 0; i < plan.send_rows; ++i)
      std::memcpy(packed + i * rb, src + (plan.send_order[static_cast<size_t>(i)] / map.top_k) * rb, rb);
    if (wave + 1 == static_cast<int>(step.waves.size())) step.encoded_x = Tensor();
    permute_phase.stop();
    sync_before_comm(group_);
    PhaseScope exchange_phase(phase::kAllToAllDispatch);
    Tensor recv = exchange(send, plan.send_counts, plan.recv_rows, plan.recv_counts, rb);
    exchange_phase.stop();
    // Global permute: source-rank blocks -> local-expert order (the rows stay encoded: they are the
    // expert MLP's saved input).
    PhaseScope global_phase(phase::kGlobalPermute);
    const auto* from = static_cast<const std::byte*>(recv.raw());
    auto* to = static_cast<std::byte*>(step.expert_in.raw());
    for (const auto& run : plan.runs)
      std::memcpy(to + run.expert_begin * rb, from + run.recv_begin * rb, rb * run.rows);
  }

  void combine_forward_wave(const Tensor& expert_out, const RouteMap& map, PathState& state,
                            int wave) override {
    BlockStep& step = step_of(state, "combine forward");
    const WavePlan& plan = wave_of(step, wave);
    const int64_t d = expert_out.dim(1);
    const PayloadFormat format = options_.precision.combine;
    Tensor recv =
        exchange_back(plan, expert_out, d, format, phase::kGlobalUnpermute, phase::kAllToAllCombine);
    // Local unpermute: each route's row to its (t, k); rows of dropped routes are left unwritten and never
    // read.
    PhaseScope scatter(phase::kLocalUnpermuteMerge);
    if (!step.gathered.defined()) step.gathered = Tensor::empty({map.tokens, map.top_k, d});
    const size_t rb = payload_row_bytes(format, d);
    const auto* rows = static_cast<const std::byte*>(recv.raw());
    float* out = step.gathered.data<float>();
    for (int64_t i = 0; i < plan.send_rows; ++i) {
      float* dst = out + plan.send_order[static_cast<size_t>(i)] * d;
      if (format == PayloadFormat::F32)
        std::memcpy(dst, rows + i * rb, rb);  // the hot f32 case without the codec's per-call checks
      else
        decode_payload_rows(format, rows + i * rb, 1, d, dst);
    }
  }

  Tensor combine_forward_end(const Tensor& topk_weight, const RouteMap& map, PathState& state) override {
    BlockStep& step = step_of(state, "combine forward");
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    EXPAR_ASSERT(step.gathered.defined(),
                 "block combine forward: combine_forward_end before any wave arrived");
    state.combine_rows = RouteRows::gathered(std::move(step.gathered), map);
    step.gathered = Tensor();
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward_begin(const Tensor& grad_y, const Tensor& /*topk_weight*/, const RouteMap& map,
                                PathState& state, Tensor& grad_topk_weight) override {
    BlockStep& step = step_of(state, "combine backward");
    EXPAR_ASSERT(state.combine_rows.defined(), "block combine backward called before combine forward");
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    step.grad_out = Tensor::empty({map.capacity_rows, grad_y.dim(1)});
    return step.grad_out;
  }

  void combine_backward_wave(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                             PathState& state, int wave) override {
    BlockStep& step = step_of(state, "combine backward");
    const WavePlan& plan = wave_of(step, wave);
    const int64_t d = grad_y.dim(1);
    const PayloadFormat format = options_.precision.combine_grad;
    const size_t rb = payload_row_bytes(format, d);
    // Local unpermute backward: each route's w·grad_y row, packed by destination rank like dispatch.
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    Tensor send = byte_rows(plan.send_rows, rb);
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    auto* packed = static_cast<std::byte*>(send.raw());
    std::vector<float> row(format == PayloadFormat::F32 ? 0 : static_cast<size_t>(d));
    for (int64_t i = 0; i < plan.send_rows; ++i) {
      const int64_t route = plan.send_order[static_cast<size_t>(i)];
      if (format == PayloadFormat::F32) {
        weighted_route_grad(gy + (route / map.top_k) * d, w[route], reinterpret_cast<float*>(packed + i * rb),
                            d);
      } else {
        weighted_route_grad(gy + (route / map.top_k) * d, w[route], row.data(), d);
        encode_payload_rows(format, row.data(), 1, d, packed + i * rb);
      }
    }
    merge_phase.stop();
    sync_before_comm(group_);
    PhaseScope exchange_phase(phase::kAllToAllCombine);
    Tensor recv = exchange(send, plan.send_counts, plan.recv_rows, plan.recv_counts, rb);
    exchange_phase.stop();
    // Global unpermute backward: received source-rank blocks into expert order, decoded for the experts.
    PhaseScope unpermute_phase(phase::kGlobalUnpermute);
    const auto* from = static_cast<const std::byte*>(recv.raw());
    float* to = step.grad_out.data<float>();
    for (const auto& run : plan.runs)
      decode_rows(format, from + run.recv_begin * rb, run.rows, d, to + run.expert_begin * d);
  }

  void dispatch_backward_wave(const Tensor& grad_expert_in, const RouteMap& /*map*/, PathState& state,
                              int wave) override {
    BlockStep& step = step_of(state, "dispatch backward");
    const WavePlan& plan = wave_of(step, wave);
    const int64_t d = grad_expert_in.dim(1);
    const PayloadFormat format = options_.precision.dispatch_grad;
    Tensor recv =
        exchange_back(plan, grad_expert_in, d, format, phase::kGlobalPermute, phase::kAllToAllDispatch);
    // Reduced-precision rows are decoded in place order; the sum reads them where they arrived.
    PhaseScope sum_phase(phase::kLocalPermute);
    if (format != PayloadFormat::F32) {
      Tensor decoded = Tensor::empty({plan.send_rows, d}, DType::F32, MemCategory::CommScratch);
      decode_rows(format, static_cast<const std::byte*>(recv.raw()), plan.send_rows, d,
                  decoded.data<float>());
      recv = std::move(decoded);
    }
    if (step.grad_recv.empty()) step.grad_recv.resize(step.waves.size());
    step.grad_recv[static_cast<size_t>(wave)] = std::move(recv);
  }

  Tensor dispatch_backward_end(const RouteMap& map, PathState& state) override {
    BlockStep& step = step_of(state, "dispatch backward");
    EXPAR_ASSERT(step.grad_recv.size() == step.waves.size(),
                 "block dispatch backward: {} of {} waves arrived before dispatch_backward_end",
                 step.grad_recv.size(), step.waves.size());
    // Local permute backward: each route's gradient row is summed where it arrived (row i of wave w's
    // receive buffer is route send_order[i] of that wave), in k order like sum_routes, without scattering it
    // to [T, K, d] first.
    PhaseScope sum_phase(phase::kLocalPermute);
    std::vector<const float*> rows(static_cast<size_t>(map.tokens * map.top_k), nullptr);
    const int64_t d = step.d;
    for (size_t w = 0; w < step.waves.size(); ++w) {
      const WavePlan& plan = step.waves[w];
      const float* received = static_cast<const float*>(step.grad_recv[w].raw());
      for (int64_t i = 0; i < plan.send_rows; ++i)
        rows[static_cast<size_t>(plan.send_order[static_cast<size_t>(i)])] = received + i * d;
    }
    Tensor grad_x = sum_route_pointers(rows.data(), map, d);
    step.grad_recv.clear();
    step.grad_out = Tensor();  // every wave's expert backward read it
    return grad_x;
  }

 private:
  void check_map(const RouteMap& map, const Tensor& x, const char* pass) const {
    EXPAR_ASSERT(
        map.sources_are_partitions(),
        "block {}: the route map sends its {} sources' rows to {} expert partitions; this path needs one "
        "partition per source rank (only agrs takes partitions of several ranks)",
        pass, map.ep_size, map.partitions);
    EXPAR_ASSERT(
        map.ep_size == group_.size() && map.ep_rank == group_.rank(),
        "block {}: the route map is for EP rank {} of {} but the path's group '{}' has rank {} of {}", pass,
        map.ep_rank, map.ep_size, group_.name(), group_.rank(), group_.size());
    EXPAR_ASSERT(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
                 "block {}: x must be f32 [{}, d], got {} {}", pass, map.tokens, dtype_name(x.dtype()),
                 shape_string(x.shape()));
  }

  static BlockStep& step_of(const PathState& state, const char* pass) {
    EXPAR_ASSERT(state.path_data != nullptr, "block {} called before dispatch forward of the same step",
                 pass);
    return *static_cast<BlockStep*>(state.path_data.get());
  }

  static const WavePlan& wave_of(const BlockStep& step, int wave) {
    EXPAR_ASSERT(wave >= 0 && wave < static_cast<int>(step.waves.size()),
                 "block path: wave {} of a step planned with {} waves", wave, step.waves.size());
    return step.waves[static_cast<size_t>(wave)];
  }

  // Packed byte rows: communication scratch.
  static Tensor byte_rows(int64_t rows, size_t row_bytes) {
    return Tensor::empty({rows, static_cast<int64_t>(row_bytes)}, DType::U8, MemCategory::CommScratch);
  }

  // all_to_all_v of packed byte rows: the host split lists are the wave's counts (times the row bytes).
  Tensor exchange(const Tensor& send, const std::vector<size_t>& send_counts, int64_t recv_rows,
                  const std::vector<size_t>& recv_counts, size_t row_bytes) {
    Tensor recv = byte_rows(recv_rows, row_bytes);
    std::vector<size_t> send_bytes(send_counts.size()), recv_bytes(recv_counts.size());
    for (size_t r = 0; r < send_counts.size(); ++r) send_bytes[r] = send_counts[r] * row_bytes;
    for (size_t r = 0; r < recv_counts.size(); ++r) recv_bytes[r] = recv_counts[r] * row_bytes;
    group_.all_to_all_v(send.raw(), send_bytes, recv.raw(), recv_bytes, DType::U8);
    return recv;
  }

  // Global unpermute (encoding each row in `format`) -> reverse all_to_all_v: [send_rows, row bytes], row
  // i holding route send_order[i] of the wave. The phase names are the forward phases these movements
  // belong to (combine) or are the adjoint of (dispatch).
  Tensor exchange_back(const WavePlan& plan, const Tensor& expert_side, int64_t d, PayloadFormat format,
                       const char* unpermute_phase, const char* exchange_phase) {
    PhaseScope unpermute(unpermute_phase);
    const size_t rb = payload_row_bytes(format, d);
    Tensor back = byte_rows(plan.recv_rows, rb);
    const float* from = expert_side.data<float>();
    auto* to = static_cast<std::byte*>(back.raw());
    for (const auto& run : plan.runs)
      encode_rows(format, from + run.expert_begin * d, run.rows, d, to + run.recv_begin * rb);
    unpermute.stop();
    sync_before_comm(group_);
    // Backward swaps the split lists.
    PhaseScope exchange_scope(exchange_phase);
    return exchange(back, plan.recv_counts, plan.send_rows, plan.send_counts, rb);
  }

  Comm& group_;
  PathOptions options_;
};

}  // namespace

std::unique_ptr<ExpertPath> make_block_path(Comm& ep_group, const PathOptions& options) {
  EXPAR_ASSERT(options.placement != nullptr && options.placement->ep_size() == ep_group.size(),
               "path 'block' needs the expert placement of its EP group '{}' ({} ranks)", ep_group.name(),
               ep_group.size());
  return std::make_unique<BlockPath>(ep_group, options);
}

}  // namespace expar
