// The `agrs` path: seed 002's collective pattern (all-gather -> local experts -> reduce-scatter).
//
//   dispatch forward:  all_gather_v the tokens [N, d] and the route map entries (dst_rank, dst_row) [N, K]
//                      of the EP group (N = Σ_s T_s, rank-major); every rank copies the gathered rows routed
//                      to ITS experts into its expert-side buffer at dst_row (contract 3 layout).
//   combine forward:   all_gather_v the router weights [N, K]; each rank builds its partial y [N, d] from its
//                      own experts' routes (k order); reduce_scatter_v sums the ranks' partials back to the
//                      source tokens.
//   backward:          the adjoint of all-gather is reduce-scatter and vice versa: grad_y is all-gathered,
//                      each rank writes w·grad_y for its routes, and the partial input / router-weight
//                      gradients are reduce-scattered.
// The decode form ("agrs-decode", seed 002's decode): every rank of the EP group already holds the same T
// tokens, so nothing is gathered and one all_reduce sums the partials. The route map still counts every
// rank as a source (of identical tokens), so each expert rank's buffer has rows for every source; only the
// rows of its own source are filled, the others are zero (so they add exactly nothing to outputs or weight
// gradients) at the price of M× expert rows.
//
// Results are equal to block/rowwise within rounding, not bit-identical: the K contributions of a token are
// summed per owning rank and then across ranks in rank order, not in k order (contract 4 holds for the other
// paths). The router-weight gradients are exact (one rank holds each route; the others add 0).
#include <cstring>
#include <utility>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// What one step keeps: the view of the routes THIS rank's experts serve, as a route map of EP size 1 over
// the gathered tokens (so the shared per-route arithmetic of route_rows.hpp applies unchanged), plus the
// gathered router weights.
struct AgrsStep {
  RouteMap mine;
  Tensor gathered_weight;  // [N, K] (prefill form; the caller's weights in the decode form)
};

class AgrsPath final : public ExpertPath {
 public:
  AgrsPath(Comm& ep_group, bool decode) : group_(ep_group), decode_(decode) {}

  std::string name() const override { return decode_ ? "agrs-decode" : "agrs"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    EXPAR_CHECK(
        map.ep_size == group_.size() && map.ep_rank == group_.rank(),
        "{} dispatch: the route map is for EP rank {} of {} but the path's group '{}' has rank {} of {}",
        name(), map.ep_rank, map.ep_size, group_.name(), group_.rank(), group_.size());
    EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
                "{} dispatch: x must be f32 [{}, d], got {} {}", name(), map.tokens, dtype_name(x.dtype()),
                shape_string(x.shape()));
    const int64_t d = x.dim(1);
    auto step = std::make_shared<AgrsStep>();
    state.path_data = step;
    Tensor tokens, dst_rank, dst_row;
    if (decode_) {
      for (int s = 0; s < map.ep_size; ++s)
        EXPAR_CHECK(
            map.tokens_per_source[static_cast<size_t>(s)] == map.tokens,
            "agrs-decode: EP rank {} has {} tokens and rank {} has {}: the decode form needs the same "
            "tokens on every rank of the EP group (use 'agrs' for sharded tokens)",
            map.ep_rank, map.tokens, s, map.tokens_per_source[static_cast<size_t>(s)]);
      tokens = x;
      dst_rank = map.dst_rank;
      dst_row = map.dst_row;
    } else {
      sync_before_comm(group_);
      PhaseScope gather_phase(phase::kAllGather);
      tokens = gather(x, map, d);
      dst_rank = gather(map.dst_rank, map, map.top_k);
      dst_row = gather(map.dst_row, map, map.top_k);
    }
    PhaseScope copy_phase(phase::kRowCopy);
    step->mine = local_view(map, dst_rank, dst_row);
    const RouteMap& mine = step->mine;
    Tensor in = Tensor::empty({map.capacity_rows, d});
    // Decode form: the rows of the other (identical) sources are zero, see the file comment.
    if (decode_) std::memset(in.raw(), 0, static_cast<size_t>(map.recv_rows * d) * sizeof(float));
    const float* src = tokens.data<float>();
    float* dst = in.data<float>();
    for (int64_t t = 0; t < mine.tokens; ++t)
      for (int k = 0; k < mine.top_k; ++k)
        if (mine.valid(t, k))
          std::memcpy(dst + static_cast<int64_t>(mine.row_of(t, k)) * d, src + t * d, sizeof(float) * d);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    AgrsStep& step = step_of(state, "combine forward");
    sync_before_comm(group_);
    PhaseScope gather_phase(phase::kAllGather);
    step.gathered_weight = decode_ ? topk_weight : gather(topk_weight, map, map.top_k);
    gather_phase.stop();
    PhaseScope merge_phase(phase::kPartialMerge);
    state.combine_rows = RouteRows::expert_side(expert_out, step.mine);
    Tensor partial = merge_routes(state.combine_rows, step.gathered_weight, step.mine);
    merge_phase.stop();
    sync_before_comm(group_);
    PhaseScope scatter_phase(phase::kReduceScatter);
    return scatter_sum(partial, map, expert_out.dim(1));
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    AgrsStep& step = step_of(state, "combine backward");
    EXPAR_CHECK(state.combine_rows.defined(), "{} combine backward called before combine forward", name());
    const int64_t d = grad_y.dim(1);
    sync_before_comm(group_);
    PhaseScope gather_phase(phase::kAllGather);
    Tensor grad_all = decode_ ? grad_y : gather(grad_y, map, d);
    gather_phase.stop();
    PhaseScope merge_phase(phase::kPartialMerge);
    Tensor partial_weight_grads = route_weight_grads(grad_all, state.combine_rows, step.mine);
    merge_phase.stop();
    sync_before_comm(group_);
    PhaseScope scatter_phase(phase::kReduceScatter);
    grad_topk_weight = scatter_sum(std::move(partial_weight_grads), map, map.top_k);
    scatter_phase.stop();
    PhaseScope copy_phase(phase::kRowCopy);
    Tensor grad_out = Tensor::empty({map.capacity_rows, d});
    if (decode_) std::memset(grad_out.raw(), 0, static_cast<size_t>(map.recv_rows * d) * sizeof(float));
    const RouteMap& mine = step.mine;
    const float* gy = grad_all.data<float>();
    const float* w = step.gathered_weight.data<float>();
    float* out = grad_out.data<float>();
    for (int64_t t = 0; t < mine.tokens; ++t)
      for (int k = 0; k < mine.top_k; ++k)
        if (mine.valid(t, k))
          weighted_route_grad(gy + t * d, w[t * mine.top_k + k],
                              out + static_cast<int64_t>(mine.row_of(t, k)) * d, d);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    AgrsStep& step = step_of(state, "dispatch backward");
    PhaseScope merge_phase(phase::kPartialMerge);
    Tensor partial = sum_routes(RouteRows::expert_side(grad_expert_in, step.mine), step.mine);
    merge_phase.stop();
    sync_before_comm(group_);
    PhaseScope scatter_phase(phase::kReduceScatter);
    return scatter_sum(partial, map, grad_expert_in.dim(1));
  }

 private:
  static AgrsStep& step_of(PathState& state, const char* pass) {
    EXPAR_CHECK(state.path_data != nullptr, "agrs {} called before dispatch forward of the same step", pass);
    return *static_cast<AgrsStep*>(state.path_data.get());
  }

  std::vector<size_t> counts_of(const RouteMap& map, int64_t per_token) const {
    std::vector<size_t> counts;
    for (int64_t t : map.tokens_per_source) counts.push_back(static_cast<size_t>(t * per_token));
    return counts;
  }

  // [T, w] of this rank -> [N, w] of the whole EP group, rank-major.
  Tensor gather(const Tensor& mine, const RouteMap& map, int64_t width) {
    int64_t total = 0;
    for (int64_t t : map.tokens_per_source) total += t;
    Tensor all = Tensor::empty({total, width}, mine.dtype());
    group_.all_gather_v(mine.raw(), static_cast<size_t>(map.tokens * width), all.raw(), counts_of(map, width),
                        mine.dtype());
    return all;
  }

  // Partial [N, w] (prefill) or [T, w] (decode) -> this rank's [T, w], summed over the EP group.
  Tensor scatter_sum(Tensor partial, const RouteMap& map, int64_t width) {
    if (decode_) {
      group_.all_reduce(partial.raw(), static_cast<size_t>(partial.numel()), DType::F32, ReduceOp::Sum);
      return partial;
    }
    Tensor mine = Tensor::empty({map.tokens, width});
    group_.reduce_scatter_v(partial.raw(), mine.raw(), counts_of(map, width), DType::F32);
    return mine;
  }

  // The routes of the gathered tokens that land on this rank's experts, as an EP-size-1 route map over
  // those tokens (every other route is -1 here: another rank serves it).
  static RouteMap local_view(const RouteMap& map, const Tensor& dst_rank, const Tensor& dst_row) {
    RouteMap v;
    v.tokens = dst_rank.dim(0);
    v.top_k = map.top_k;
    v.num_experts = map.num_experts;
    v.ep_size = 1;
    v.ep_rank = 0;
    v.capacity_rows = map.capacity_rows;
    v.expert_offsets = map.expert_offsets;
    v.recv_rows = map.recv_rows;
    v.dst_rank = Tensor::empty({v.tokens, v.top_k}, DType::I32);
    v.dst_row = Tensor::empty({v.tokens, v.top_k}, DType::I32);
    const int32_t* rank = dst_rank.data<int32_t>();
    const int32_t* row = dst_row.data<int32_t>();
    int32_t* vr = v.dst_rank.data<int32_t>();
    int32_t* vw = v.dst_row.data<int32_t>();
    for (int64_t i = 0; i < v.tokens * v.top_k; ++i) {
      const bool here = row[i] >= 0 && rank[i] == map.ep_rank;
      vr[i] = here ? 0 : -1;
      vw[i] = here ? row[i] : -1;
    }
    return v;
  }

  Comm& group_;
  bool decode_;
};

}  // namespace

std::unique_ptr<ExpertPath> make_agrs_path(Comm& ep_group, const PathOptions& options) {
  return std::make_unique<AgrsPath>(ep_group, options.agrs_decode);
}

std::unique_ptr<ExpertPath> make_agrs_decode_path(Comm& ep_group, const PathOptions& options) {
  return std::make_unique<AgrsPath>(ep_group, true);
}

}  // namespace expar
