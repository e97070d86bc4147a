// The `local` path (MoE without EP, M_E = 1): dispatch permutes token rows into expert order by dst_row;
// combine unpermutes and merges. Seed 000 §5.2: "The permutation is local dispatch; the final unpermutation
// and weighted reduction are local combine."
#include <omp.h>

#include <cstring>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// Row copies are split over the rank's compute threads only when there is enough to copy.
bool parallel_rows(const RouteMap& map, int64_t d) {
  return map.tokens * map.top_k * d >= (int64_t{1} << 16) && omp_get_max_threads() > 1;
}

class LocalPath final : public ExpertPath {
 public:
  std::string name() const override { return "local"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    check_map(map);
    const int64_t d = x.dim(1);
    EXPAR_ASSERT(x.dim(0) == map.tokens, "local dispatch: x has {} rows, the route map {} tokens", x.dim(0),
                 map.tokens);
    PhaseScope permute_phase(phase::kLocalPermute);
    Tensor in = Tensor::empty({map.capacity_rows, d});
    const float* src = x.data<float>();
    float* dst = in.data<float>();
    // Every route writes its own row: tokens split over the rank's compute threads change no result.
#pragma omp parallel for schedule(static) if (parallel_rows(map, d))
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k))
          std::memcpy(dst + static_cast<int64_t>(map.row_of(t, k)) * d, src + t * d, sizeof(float) * d);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    check_map(map);
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    state.combine_rows = RouteRows::expert_side(expert_out, map);
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    check_map(map);
    EXPAR_ASSERT(state.combine_rows.defined(), "local combine backward called before combine forward");
    PhaseScope merge_phase(phase::kLocalUnpermuteMerge);
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    const int64_t d = grad_y.dim(1);
    Tensor grad_out = Tensor::empty({map.capacity_rows, d});
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    float* out = grad_out.data<float>();
#pragma omp parallel for schedule(static) if (parallel_rows(map, d))
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k))
          weighted_route_grad(gy + t * d, w[t * map.top_k + k],
                              out + static_cast<int64_t>(map.row_of(t, k)) * d, d);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    check_map(map);
    PhaseScope permute_phase(phase::kLocalPermute);
    return sum_routes(RouteRows::expert_side(grad_expert_in, map), map);
  }

 private:
  static void check_map(const RouteMap& map) {
    EXPAR_CHECK(map.ep_size == 1,
                "path 'local' moves no rows between ranks but the route map is for an EP group "
                "of {}: use an EP path (block, rowwise, agrs) or an EP degree of 1",
                map.ep_size);
  }
};

}  // namespace

std::unique_ptr<ExpertPath> make_local_path(Comm& ep_group, const PathOptions& options) {
  EXPAR_CHECK(ep_group.size() == 1,
              "path 'local' needs an EP group of 1 rank, but '{}' has {}: choose an EP path (block, rowwise, "
              "agrs) or EP degree 1",
              ep_group.name(), ep_group.size());
  return std::make_unique<LocalPath>();
}

}  // namespace expar
