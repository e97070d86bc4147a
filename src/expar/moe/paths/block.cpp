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
#include <algorithm>
#include <cstring>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// The layout plan of one step, derived from the route map once in dispatch_forward and reused by every
// later pass of the step (the route map is saved for backward, so is this).
struct BlockPlan {
  // Routes (t*K + k) in send-buffer order: by destination rank, then dst_row.
  std::vector<int64_t> send_order;
  // Split lists in elements (rows * d), indexed by peer.
  std::vector<size_t> send_elems, recv_elems;
  // Global permute as block copies: rows [recv_begin, recv_begin + rows) of the receive buffer are rows
  // [expert_begin, expert_begin + rows) of the expert-side buffer (one run per (source, local expert)).
  struct Run {
    int64_t recv_begin = 0, expert_begin = 0, rows = 0;
  };
  std::vector<Run> runs;
  int64_t send_rows = 0, recv_rows = 0;
};

BlockPlan make_plan(const RouteMap& map, const ExpertPlacement& placement, int64_t d) {
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
    plan.send_elems.push_back(static_cast<size_t>(map.send_counts[static_cast<size_t>(r)] * d));
    plan.recv_elems.push_back(static_cast<size_t>(map.recv_counts[static_cast<size_t>(r)] * d));
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
    PhaseScope permute_phase(phase::kLocalPermute);  // the plan's sort is part of the local permute
    auto plan = std::make_shared<BlockPlan>(make_plan(map, *options_.placement, d));
    state.path_data = plan;
    // Local permute: replicate each token row once per accepted route, packed by destination rank.
    Tensor send = Tensor::empty({plan->send_rows, d}, DType::F32, MemCategory::CommScratch);
    const float* src = x.data<float>();
    float* packed = send.data<float>();
    for (int64_t i = 0; i < plan->send_rows; ++i)
      std::memcpy(packed + i * d, src + (plan->send_order[static_cast<size_t>(i)] / map.top_k) * d,
                  sizeof(float) * d);
    permute_phase.stop();
    sync_before_comm(group_);
    PhaseScope exchange_phase(phase::kAllToAllDispatch);
    Tensor recv = exchange(send, plan->send_elems, plan->recv_rows, plan->recv_elems, d);
    exchange_phase.stop();
    // Global permute: source-rank blocks -> local-expert order.
    PhaseScope global_phase(phase::kGlobalPermute);
    Tensor in = Tensor::empty({map.capacity_rows, d});
    global_permute(*plan, recv, in, d);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    const BlockPlan& plan = plan_of(state, "combine forward");
    const int64_t d = expert_out.dim(1);
    Tensor gathered = return_to_sources(plan, expert_out, map, d, phase::kGlobalUnpermute,
                                        phase::kAllToAllCombine, phase::kLocalUnpermuteMerge);
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
    // Local unpermute backward: each route's w·grad_y row, packed by destination rank like dispatch.
    Tensor send = Tensor::empty({plan.send_rows, d}, DType::F32, MemCategory::CommScratch);
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    float* packed = send.data<float>();
    for (int64_t i = 0; i < plan.send_rows; ++i) {
      const int64_t route = plan.send_order[static_cast<size_t>(i)];
      weighted_route_grad(gy + (route / map.top_k) * d, w[route], packed + i * d, d);
    }
    merge_phase.stop();
    sync_before_comm(group_);
    PhaseScope exchange_phase(phase::kAllToAllCombine);
    Tensor recv = exchange(send, plan.send_elems, plan.recv_rows, plan.recv_elems, d);
    exchange_phase.stop();
    PhaseScope unpermute_phase(phase::kGlobalUnpermute);
    Tensor grad_out = Tensor::empty({map.capacity_rows, d});
    global_permute(plan, recv, grad_out, d);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    const BlockPlan& plan = plan_of(state, "dispatch backward");
    const int64_t d = grad_expert_in.dim(1);
    Tensor recv = exchange_back(plan, grad_expert_in, d, phase::kGlobalPermute, phase::kAllToAllDispatch);
    // Local permute backward: each route's gradient row is summed where it arrived (row i of the receive
    // buffer is route send_order[i]), in k order like sum_routes, without scattering it to [T, K, d] first.
    PhaseScope sum_phase(phase::kLocalPermute);
    std::vector<const float*> rows(static_cast<size_t>(map.tokens * map.top_k), nullptr);
    const float* received = recv.data<float>();
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

  // all_to_all_v of a packed buffer: the host split lists are the route map's counts (times d).
  Tensor exchange(const Tensor& send, const std::vector<size_t>& send_elems, int64_t recv_rows,
                  const std::vector<size_t>& recv_elems, int64_t d) {
    Tensor recv = Tensor::empty({recv_rows, d}, DType::F32, MemCategory::CommScratch);
    group_.all_to_all_v(send.raw(), send_elems, recv.raw(), recv_elems, DType::F32);
    return recv;
  }

  static void global_permute(const BlockPlan& plan, const Tensor& recv, Tensor& expert_side, int64_t d) {
    const float* from = recv.data<float>();
    float* to = expert_side.data<float>();
    for (const auto& run : plan.runs)
      std::memcpy(to + run.expert_begin * d, from + run.recv_begin * d, sizeof(float) * run.rows * d);
  }

  // Global unpermute -> reverse all_to_all_v -> local unpermute: expert-side rows [recv_rows, d] become
  // [T, K, d] at each route's (t, k); rows of dropped routes are left unwritten and never read. The three
  // phase names are the forward phases these movements belong to (combine) or are the adjoint of (dispatch).
  Tensor return_to_sources(const BlockPlan& plan, const Tensor& expert_side, const RouteMap& map, int64_t d,
                           const char* unpermute_phase, const char* exchange_phase,
                           const char* scatter_phase) {
    Tensor recv = exchange_back(plan, expert_side, d, unpermute_phase, exchange_phase);
    PhaseScope scatter(scatter_phase);
    Tensor gathered = Tensor::empty({map.tokens, map.top_k, d});
    const float* rows = recv.data<float>();
    float* out = gathered.data<float>();
    for (int64_t i = 0; i < plan.send_rows; ++i)
      std::memcpy(out + plan.send_order[static_cast<size_t>(i)] * d, rows + i * d, sizeof(float) * d);
    return gathered;
  }

  // Global unpermute -> reverse all_to_all_v: [send_rows, d], row i holding route send_order[i].
  Tensor exchange_back(const BlockPlan& plan, const Tensor& expert_side, int64_t d,
                       const char* unpermute_phase, const char* exchange_phase) {
    PhaseScope unpermute(unpermute_phase);
    Tensor back = Tensor::empty({plan.recv_rows, d}, DType::F32, MemCategory::CommScratch);
    const float* from = expert_side.data<float>();
    float* to = back.data<float>();
    for (const auto& run : plan.runs)
      std::memcpy(to + run.recv_begin * d, from + run.expert_begin * d, sizeof(float) * run.rows * d);
    unpermute.stop();
    sync_before_comm(group_);
    // Backward swaps the split lists.
    PhaseScope exchange_scope(exchange_phase);
    return exchange(back, plan.recv_elems, plan.send_rows, plan.send_elems, d);
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
