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
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// The layout plan of one step, derived from the route map once in dispatch_forward and reused by every
// later pass of the step (the route map is saved for backward, so is this).
struct BlockPlan {
  // Routes (t*K + k) in send-buffer order: by destination rank, then dst_row.
  std::vector<int64_t> send_order;
  // Split lists in rows, indexed by peer.
  std::vector<size_t> send_counts, recv_counts;
  // Global permute as block copies: rows [recv_begin, recv_begin + rows) of the receive buffer are rows
  // [expert_begin, expert_begin + rows) of the expert-side buffer (one run per (source, local expert)).
  struct Run {
    int64_t recv_begin = 0, expert_begin = 0, rows = 0;
  };
  std::vector<Run> runs;
  int64_t send_rows = 0, recv_rows = 0;
};

BlockPlan make_plan(const RouteMap& map, const ExpertPlacement& placement) {
  BlockPlan plan;
  const int m = map.ep_size;
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k)
      if (map.valid(t, k)) plan.send_order.push_back(t * map.top_k + k);
  const int32_t* rank = map.dst_rank.data<int32_t>();
  const int32_t* row = map.dst_row.data<int32_t>();
  std::sort(plan.send_order.begin(), plan.send_order.end(),
            [&](int64_t a, int64_t b) { return rank[a] != rank[b] ? rank[a] < rank[b] : row[a] < row[b]; });
  plan.send_rows = static_cast<int64_t>(plan.send_order.size());
  plan.recv_rows = map.recv_rows;
  for (int r = 0; r < m; ++r) {
    plan.send_counts.push_back(static_cast<size_t>(map.send_counts[static_cast<size_t>(r)]));
    plan.recv_counts.push_back(static_cast<size_t>(map.recv_counts[static_cast<size_t>(r)]));
  }
  // Source s's block holds its routes to this rank sorted by dst_row, i.e. for each local expert in order
  // its accepted rows, which land after the rows of the sources before s (contract 3).
  const std::vector<int> local = placement.local_experts(map.ep_rank);
  int64_t recv_begin = 0;
  for (int s = 0; s < m; ++s) {
    for (size_t l = 0; l < local.size(); ++l) {
      const int e = local[l];
      int64_t before = 0;
      for (int q = 0; q < s; ++q) before += map.accepted_of(q, e);
      const int64_t rows = map.accepted_of(s, e);
      if (rows > 0) plan.runs.push_back({recv_begin, map.expert_offsets[l] + before, rows});
      recv_begin += rows;
    }
  }
  EXPAR_CHECK(recv_begin == map.recv_rows,
              "block path: the accepted matrix gives rank {} {} rows but the route map says {}", map.ep_rank,
              recv_begin, map.recv_rows);
  return plan;
}

class BlockPath final : public ExpertPath {
 public:
  BlockPath(Comm& ep_group, const PathOptions& options) : group_(ep_group), options_(options) {}

  std::string name() const override { return "block"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    check_map(map, x, "dispatch forward");
    const int64_t d = x.dim(1);
    const PayloadFormat format = options_.precision.dispatch;
    const size_t rb = payload_row_bytes(format, d);
    PhaseScope permute_phase(phase::kLocalPermute);  // the plan's sort is part of the local permute
    auto plan = std::make_shared<BlockPlan>(make_plan(map, *options_.placement));
    state.path_data = plan;
    // Local permute: replicate each token row once per accepted route, packed by destination rank (a
    // reduced-precision row is encoded once per token, then replicated).
    const std::byte* src = static_cast<const std::byte*>(x.raw());
    Tensor encoded;
    if (format != PayloadFormat::F32) {
      encoded = Tensor::empty({map.tokens, static_cast<int64_t>(rb)}, DType::U8, MemCategory::CommScratch);
      encode_rows(format, x.data<float>(), map.tokens, d, static_cast<std::byte*>(encoded.raw()));
      src = static_cast<const std::byte*>(encoded.raw());
    }
    Tensor send = byte_rows(plan->send_rows, rb);
    auto* packed = static_cast<std::byte*>(send.raw());
    for (int64_t i = 0; i < plan->send_rows; ++i)
      std::memcpy(packed + i * rb, src + (plan->send_order[static_cast<size_t>(i)] / map.top_k) * rb, rb);
    encoded = Tensor();
    permute_phase.stop();
    sync_before_comm(group_);
    PhaseScope exchange_phase(phase::kAllToAllDispatch);
    Tensor recv = exchange(send, plan->send_counts, plan->recv_rows, plan->recv_counts, rb);
    exchange_phase.stop();
    // Global permute: source-rank blocks -> local-expert order (the rows stay encoded: they are the
    // expert MLP's saved input).
    PhaseScope global_phase(phase::kGlobalPermute);
    Tensor in = payload_tensor(format, map.capacity_rows, d);
    const auto* from = static_cast<const std::byte*>(recv.raw());
    auto* to = static_cast<std::byte*>(in.raw());
    for (const auto& run : plan->runs)
      std::memcpy(to + run.expert_begin * rb, from + run.recv_begin * rb, rb * run.rows);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    const BlockPlan& plan = plan_of(state, "combine forward");
    const int64_t d = expert_out.dim(1);
    Tensor gathered = return_to_sources(plan, expert_out, map, d, options_.precision.combine);
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    state.combine_rows = RouteRows::gathered(std::move(gathered), map);
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    const BlockPlan& plan = plan_of(state, "combine backward");
    EXPAR_CHECK(state.combine_rows.defined(), "block combine backward called before combine forward");
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    const int64_t d = grad_y.dim(1);
    const PayloadFormat format = options_.precision.combine_grad;
    const size_t rb = payload_row_bytes(format, d);
    // Local unpermute backward: each route's w·grad_y row, packed by destination rank like dispatch.
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
    Tensor grad_out = Tensor::empty({map.capacity_rows, d});
    const auto* from = static_cast<const std::byte*>(recv.raw());
    float* to = grad_out.data<float>();
    for (const auto& run : plan.runs)
      decode_rows(format, from + run.recv_begin * rb, run.rows, d, to + run.expert_begin * d);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    const BlockPlan& plan = plan_of(state, "dispatch backward");
    const int64_t d = grad_expert_in.dim(1);
    const PayloadFormat format = options_.precision.dispatch_grad;
    Tensor recv =
        exchange_back(plan, grad_expert_in, d, format, phase::kGlobalPermute, phase::kAllToAllDispatch);
    // Local permute backward: each route's gradient row is summed where it arrived (row i of the receive
    // buffer is route send_order[i]), in k order like sum_routes, without scattering it to [T, K, d] first
    // (reduced-precision rows are decoded in place order first).
    PhaseScope sum_phase(phase::kLocalPermute);
    if (format != PayloadFormat::F32) {
      Tensor decoded = Tensor::empty({plan.send_rows, d}, DType::F32, MemCategory::CommScratch);
      decode_rows(format, static_cast<const std::byte*>(recv.raw()), plan.send_rows, d,
                  decoded.data<float>());
      recv = std::move(decoded);
    }
    std::vector<const float*> rows(static_cast<size_t>(map.tokens * map.top_k), nullptr);
    const float* received = static_cast<const float*>(recv.raw());
    for (int64_t i = 0; i < plan.send_rows; ++i)
      rows[static_cast<size_t>(plan.send_order[static_cast<size_t>(i)])] = received + i * d;
    return sum_route_pointers(rows.data(), map, d);
  }

 private:
  void check_map(const RouteMap& map, const Tensor& x, const char* pass) const {
    EXPAR_CHECK(map.ep_size == group_.size() && map.ep_rank == group_.rank(),
                "block {}: the route map is for EP rank {} of {} but the path's group '{}' has rank {} of {}",
                pass, map.ep_rank, map.ep_size, group_.name(), group_.rank(), group_.size());
    EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
                "block {}: x must be f32 [{}, d], got {} {}", pass, map.tokens, dtype_name(x.dtype()),
                shape_string(x.shape()));
  }

  static const BlockPlan& plan_of(const PathState& state, const char* pass) {
    EXPAR_CHECK(state.path_data != nullptr, "block {} called before dispatch forward of the same step", pass);
    return *static_cast<const BlockPlan*>(state.path_data.get());
  }

  // Packed byte rows: communication scratch.
  static Tensor byte_rows(int64_t rows, size_t row_bytes) {
    return Tensor::empty({rows, static_cast<int64_t>(row_bytes)}, DType::U8, MemCategory::CommScratch);
  }

  // all_to_all_v of packed byte rows: the host split lists are the route map's counts (times the row bytes).
  Tensor exchange(const Tensor& send, const std::vector<size_t>& send_counts, int64_t recv_rows,
                  const std::vector<size_t>& recv_counts, size_t row_bytes) {
    Tensor recv = byte_rows(recv_rows, row_bytes);
    std::vector<size_t> send_bytes(send_counts.size()), recv_bytes(recv_counts.size());
    for (size_t r = 0; r < send_counts.size(); ++r) send_bytes[r] = send_counts[r] * row_bytes;
    for (size_t r = 0; r < recv_counts.size(); ++r) recv_bytes[r] = recv_counts[r] * row_bytes;
    group_.all_to_all_v(send.raw(), send_bytes, recv.raw(), recv_bytes, DType::U8);
    return recv;
  }

  // Global unpermute -> reverse all_to_all_v -> local unpermute: expert-side rows [recv_rows, d] become
  // [T, K, d] at each route's (t, k), travelling in `format`; rows of dropped routes are left unwritten and
  // never read. The phases are combine's (this is combine forward).
  Tensor return_to_sources(const BlockPlan& plan, const Tensor& expert_side, const RouteMap& map, int64_t d,
                           PayloadFormat format) {
    Tensor recv =
        exchange_back(plan, expert_side, d, format, phase::kGlobalUnpermute, phase::kAllToAllCombine);
    PhaseScope scatter(phase::kLocalUnpermuteMerge);
    const size_t rb = payload_row_bytes(format, d);
    Tensor gathered = Tensor::empty({map.tokens, map.top_k, d});
    const auto* rows = static_cast<const std::byte*>(recv.raw());
    float* out = gathered.data<float>();
    for (int64_t i = 0; i < plan.send_rows; ++i) {
      float* dst = out + plan.send_order[static_cast<size_t>(i)] * d;
      if (format == PayloadFormat::F32)
        std::memcpy(dst, rows + i * rb, rb);  // the hot f32 case without the codec's per-call checks
      else
        decode_payload_rows(format, rows + i * rb, 1, d, dst);
    }
    return gathered;
  }

  // Global unpermute (encoding each row in `format`) -> reverse all_to_all_v: [send_rows, row bytes], row
  // i holding route send_order[i]. The phase names are the forward phases these movements belong to
  // (combine) or are the adjoint of (dispatch).
  Tensor exchange_back(const BlockPlan& plan, const Tensor& expert_side, int64_t d, PayloadFormat format,
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
  EXPAR_CHECK(options.placement != nullptr && options.placement->ep_size() == ep_group.size(),
              "path 'block' needs the expert placement of its EP group '{}' ({} ranks)", ep_group.name(),
              ep_group.size());
  return std::make_unique<BlockPath>(ep_group, options);
}

}  // namespace expar
