// The `agrs` path: seed 002's collective pattern (all-gather -> local experts -> reduce-scatter).
//
//   dispatch forward:  all-gather the tokens [T, d] with their routes (dst_rank, dst_row) [T, K] (and, when
//                      the caller hands them over, the router weights [T, K]) in ONE packed message per
//                      level; every rank copies the gathered rows routed to ITS partition's experts into its
//                      expert-side buffer at dst_row (contract 3 layout).
//   combine forward:   each rank builds its partial y [N, d] from its own experts' routes (k order) over all
//                      N gathered tokens; reduce-scatter sums the ranks' partials back to the source tokens.
//   backward:          the adjoint of all-gather is reduce-scatter and vice versa: grad_y is all-gathered,
//                      each rank writes w·grad_y for its routes, and the partial input / router-weight
//                      gradients are reduce-scattered.
// Levels (path.hpp AgrsLevel): the collectives run over a stack of groups, inner first; gathering levels
// all-gather in dispatch (inner first) and reduce-scatter in combine (outer first), replicated levels (ranks
// that hold the same tokens) all-reduce in combine before those. One gathering level over the EP group is
// the MoE layer's `agrs`; one replicated level is `agrs-decode`; inference stacks TP and DP (seed 002's
// cross-DP EP) and places experts on partitions of several ranks (variable EP: each rank of a partition
// computes its intermediate shard of the partition's rows, and the same sums add the shards).
// The decode form with the MoE layer's map ("agrs-decode": every rank of the EP group holds the same T tokens
// and the map counts each as a source): only the rows of its own source are filled, the others are zero (so
// they add exactly nothing to outputs or weight gradients) at the price of M× expert rows. Inference builds
// its decode map with the replicated ranks as ONE source instead, so no row is wasted. With redundant
// experts (a route map of slots) only such a map works: the MoE layer's decode form is refused (check_map).
//
// Results are equal to block/rowwise within rounding, not bit-identical: the K contributions of a token are
// summed per owning rank and then across ranks in rank order, not in k order (contract 4 holds for the other
// paths). The router-weight gradients are exact (one partition holds each route; the others add 0).
#include <cstring>
#include <utility>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// What one step keeps: the view of the routes THIS rank's partition serves, as a route map of EP size 1 over
// the gathered tokens (so the shared per-route arithmetic of route_rows.hpp applies unchanged), plus the
// gathered router weights.
struct AgrsStep {
  RouteMap mine;
  Tensor gathered_weight;  // [N, K]; undefined until gathered (or handed over in dispatch)
};

// Rows of sources [first, first + count).
int64_t rows_of(const RouteMap& map, int64_t first, int64_t count) {
  int64_t rows = 0;
  for (int64_t s = first; s < first + count; ++s) rows += map.tokens_per_source[static_cast<size_t>(s)];
  return rows;
}

// Routes travel as their int32 bits in f32 slots of the packed rows (the gathers copy bytes; no arithmetic).
float bits_to_float(int32_t v) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}
int32_t float_to_bits(float f) {
  int32_t v;
  std::memcpy(&v, &f, sizeof v);
  return v;
}

class AgrsPath final : public ExpertPath {
 public:
  AgrsPath(Comm& ep_group, const PathOptions& options) : decode_(options.agrs_decode) {
    levels_ = options.agrs_levels;
    if (levels_.empty()) levels_.push_back({&ep_group, decode_});
    for (const AgrsLevel& level : levels_) {
      EXPAR_ASSERT(level.group != nullptr, "agrs level without a group");
      if (!level.replicated) gathering_sources_ *= level.group->size();
    }
  }

  std::string name() const override { return decode_ ? "agrs-decode" : "agrs"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    check_map(map);
    EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
                "{} dispatch: x must be f32 [{}, d], got {} {}", name(), map.tokens, dtype_name(x.dtype()),
                shape_string(x.shape()));
    const int64_t d = x.dim(1), k = map.top_k;
    const Tensor* weight = state.agrs.topk_weight;
    if (weight != nullptr)
      EXPAR_CHECK(weight->dtype() == DType::F32 && weight->ndim() == 2 && weight->dim(0) == map.tokens &&
                      weight->dim(1) == k,
                  "{} dispatch: the router weights must be f32 [{}, {}], got {} {}", name(), map.tokens, k,
                  dtype_name(weight->dtype()), shape_string(weight->shape()));
    auto step = std::make_shared<AgrsStep>();
    state.path_data = step;
    Tensor tokens, dst_rank, dst_row;
    if (gathering_sources_ == 1) {
      tokens = x;
      dst_rank = map.dst_rank;
      dst_row = map.dst_row;
      if (weight != nullptr) step->gathered_weight = *weight;
    } else {
      const int64_t width = d + 2 * k + (weight != nullptr ? k : 0);
      Tensor all = gather(pack(x, map, weight), map, width);
      PhaseScope copy_phase(phase::kRowCopy);
      unpack(all, d, k, weight != nullptr, tokens, dst_rank, dst_row, step->gathered_weight);
    }
    PhaseScope copy_phase(phase::kRowCopy);
    state.agrs.gathered_tokens = tokens;
    step->mine = local_view(map, dst_rank, dst_row);
    const RouteMap& mine = step->mine;
    Tensor in = Tensor::empty({map.capacity_rows, d});
    // The MoE layer's decode map: the rows of the other (identical) sources are zero, see the file comment.
    if (zero_other_sources(map))
      std::memset(in.raw(), 0, static_cast<size_t>(map.recv_rows * d) * sizeof(float));
    const float* src = tokens.data<float>();
    float* dst = in.data<float>();
    for (int64_t t = 0; t < mine.tokens; ++t)
      for (int j = 0; j < mine.top_k; ++j)
        if (mine.valid(t, j))
          std::memcpy(dst + static_cast<int64_t>(mine.row_of(t, j)) * d, src + t * d, sizeof(float) * d);
    return in;
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    AgrsStep& step = step_of(state, "combine forward");
    if (!step.gathered_weight.defined())
      step.gathered_weight = gathering_sources_ == 1 ? topk_weight : gather(topk_weight, map, map.top_k);
    PhaseScope merge_phase(phase::kPartialMerge);
    state.combine_rows = RouteRows::expert_side(expert_out, step.mine);
    Tensor partial = merge_routes(state.combine_rows, step.gathered_weight, step.mine);
    merge_phase.stop();
    return reduce(std::move(partial), map, expert_out.dim(1), &state.agrs);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    (void)topk_weight;  // the gathered copy of combine_forward is the one the routes use
    AgrsStep& step = step_of(state, "combine backward");
    EXPAR_CHECK(state.combine_rows.defined(), "{} combine backward called before combine forward", name());
    const int64_t d = grad_y.dim(1);
    Tensor grad_all = gathering_sources_ == 1 ? grad_y : gather(grad_y, map, d);
    PhaseScope merge_phase(phase::kPartialMerge);
    Tensor partial_weight_grads = route_weight_grads(grad_all, state.combine_rows, step.mine);
    merge_phase.stop();
    grad_topk_weight = reduce(std::move(partial_weight_grads), map, map.top_k);
    PhaseScope copy_phase(phase::kRowCopy);
    Tensor grad_out = Tensor::empty({map.capacity_rows, d});
    if (zero_other_sources(map))
      std::memset(grad_out.raw(), 0, static_cast<size_t>(map.recv_rows * d) * sizeof(float));
    const RouteMap& mine = step.mine;
    const float* gy = grad_all.data<float>();
    const float* w = step.gathered_weight.data<float>();
    float* out = grad_out.data<float>();
    for (int64_t t = 0; t < mine.tokens; ++t)
      for (int j = 0; j < mine.top_k; ++j)
        if (mine.valid(t, j))
          weighted_route_grad(gy + t * d, w[t * mine.top_k + j],
                              out + static_cast<int64_t>(mine.row_of(t, j)) * d, d);
    return grad_out;
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    AgrsStep& step = step_of(state, "dispatch backward");
    PhaseScope merge_phase(phase::kPartialMerge);
    Tensor partial = sum_routes(RouteRows::expert_side(grad_expert_in, step.mine), step.mine);
    merge_phase.stop();
    return reduce(std::move(partial), map, grad_expert_in.dim(1));
  }

 private:
  static AgrsStep& step_of(PathState& state, const char* pass) {
    EXPAR_CHECK(state.path_data != nullptr, "agrs {} called before dispatch forward of the same step", pass);
    return *static_cast<AgrsStep*>(state.path_data.get());
  }

  // The sources of the map must be the gathering levels' ranks (one source when nothing is gathered), or,
  // with only replicated levels, the ranks of the MoE layer's EP group holding identical tokens.
  void check_map(const RouteMap& map) const {
    const Comm& outer = *levels_.back().group;
    if (zero_other_sources(map)) {
      EXPAR_CHECK(
          map.ep_size == outer.size() && map.ep_rank == outer.rank(),
          "{} dispatch: the route map is for EP rank {} of {} but the path's group '{}' has rank {} of "
          "{}",
          name(), map.ep_rank, map.ep_size, outer.name(), outer.rank(), outer.size());
      for (int s = 0; s < map.ep_size; ++s)
        EXPAR_CHECK(
            map.tokens_per_source[static_cast<size_t>(s)] == map.tokens,
            "agrs-decode: EP rank {} has {} tokens and rank {} has {}: the decode form needs the same "
            "tokens on every rank of the EP group (use 'agrs' for sharded tokens)",
            map.ep_rank, map.tokens, s, map.tokens_per_source[static_cast<size_t>(s)]);
      // Each rank serves its own source's routes; the replica rule deals a route by its source's place in
      // the group, so identical sources would send the same route to different replicas (served twice or
      // not at all).
      EXPAR_CHECK(
          map.num_slots == map.num_experts,
          "agrs-decode with redundant experts ({} slots for {} experts): its ranks hold the same tokens "
          "as separate sources, which the replica rule deals to different replicas: use 'agrs' with "
          "sharded tokens, or a decode map with the replicated ranks as one source (the engine's)",
          map.num_slots, map.num_experts);
      return;
    }
    EXPAR_CHECK(map.ep_size == gathering_sources_,
                "{} dispatch: the route map has {} source ranks but the path gathers over {} ({} level(s), "
                "outer group '{}' of {}): build the map over the gathering ranks",
                name(), map.ep_size, gathering_sources_, levels_.size(), outer.name(), outer.size());
    int64_t inner = 1;
    for (const AgrsLevel& level : levels_) {
      if (level.replicated) continue;
      const int n = level.group->size();
      EXPAR_CHECK(level.group->rank() == map.ep_rank / inner % n,
                  "{}: source rank {} of the route map must be rank {} of group '{}', which says {}: order "
                  "the map's sources outer-major over the levels",
                  name(), map.ep_rank, map.ep_rank / inner % n, level.group->name(), level.group->rank());
      inner *= n;
    }
  }

  bool zero_other_sources(const RouteMap& map) const { return gathering_sources_ == 1 && map.ep_size > 1; }

  // [T, d + 2K (+K)]: each token's row, its routes' destination partition and row, and its router weights.
  static Tensor pack(const Tensor& x, const RouteMap& map, const Tensor* weight) {
    const int64_t t_count = x.dim(0), d = x.dim(1), k = map.top_k;
    const int64_t width = d + 2 * k + (weight != nullptr ? k : 0);
    Tensor packed = Tensor::empty({t_count, width}, DType::F32, MemCategory::CommScratch);
    for (int64_t t = 0; t < t_count; ++t) {
      float* p = packed.data<float>() + t * width;
      std::memcpy(p, x.data<float>() + t * d, sizeof(float) * static_cast<size_t>(d));
      for (int64_t j = 0; j < k; ++j) {
        p[d + j] = bits_to_float(map.dst_rank.data<int32_t>()[t * k + j]);
        p[d + k + j] = bits_to_float(map.dst_row.data<int32_t>()[t * k + j]);
        if (weight != nullptr) p[d + 2 * k + j] = weight->data<float>()[t * k + j];
      }
    }
    return packed;
  }

  static void unpack(const Tensor& all, int64_t d, int64_t k, bool with_weight, Tensor& tokens,
                     Tensor& dst_rank, Tensor& dst_row, Tensor& weight) {
    const int64_t n = all.dim(0), width = all.dim(1);
    tokens = Tensor::empty({n, d});
    dst_rank = Tensor::empty({n, k}, DType::I32);
    dst_row = Tensor::empty({n, k}, DType::I32);
    if (with_weight) weight = Tensor::empty({n, k});
    for (int64_t t = 0; t < n; ++t) {
      const float* p = all.data<float>() + t * width;
      std::memcpy(tokens.data<float>() + t * d, p, sizeof(float) * static_cast<size_t>(d));
      for (int64_t j = 0; j < k; ++j) {
        dst_rank.data<int32_t>()[t * k + j] = float_to_bits(p[d + j]);
        dst_row.data<int32_t>()[t * k + j] = float_to_bits(p[d + k + j]);
        if (with_weight) weight.data<float>()[t * k + j] = p[d + 2 * k + j];
      }
    }
  }

  // [T, w] of this source -> [N, w] of every source, source-major: an all-gather per gathering level, inner
  // first (after level j a rank holds the contiguous block of sources that share its outer indices).
  Tensor gather(const Tensor& mine, const RouteMap& map, int64_t width) {
    Tensor cur = mine;
    int64_t inner = 1;
    for (const AgrsLevel& level : levels_) {
      if (level.replicated) continue;
      const int n = level.group->size();
      const int64_t base = map.ep_rank / (inner * n) * (inner * n);
      std::vector<size_t> counts(static_cast<size_t>(n));
      int64_t rows = 0;
      for (int j = 0; j < n; ++j) {
        const int64_t r = rows_of(map, base + j * inner, inner);
        counts[static_cast<size_t>(j)] = static_cast<size_t>(r * width);
        rows += r;
      }
      Tensor next = Tensor::empty({rows, width}, mine.dtype(), MemCategory::CommScratch);
      sync_before_comm(*level.group);
      PhaseScope phase_scope(phase::kAllGather);
      level.group->all_gather_v(cur.raw(), static_cast<size_t>(cur.numel()), next.raw(), counts,
                                mine.dtype());
      cur = std::move(next);
      inner *= n;
    }
    return cur;
  }

  // Partial [N, w] over the gathered sources (or [T, w] when nothing is gathered) -> this source's [T, w],
  // summed over every rank: all-reduce over the replicated levels, then reduce-scatter over the gathering
  // levels, outer first (seed 002's order in both of its phases).
  Tensor reduce(Tensor partial, const RouteMap& map, int64_t width, const PathState::Agrs* io = nullptr) {
    const bool with_addend = io != nullptr && io->combine_addend.defined();
    if (with_addend)
      EXPAR_CHECK(io->addend_level >= 0 && io->addend_level < static_cast<int>(levels_.size()),
                  "agrs combine: addend level {} is not one of the path's {} levels", io->addend_level,
                  levels_.size());
    auto add_before = [&](size_t level) {
      if (with_addend && static_cast<size_t>(io->addend_level) == level) add_addend(partial, *io);
    };
    for (size_t i = 0; i < levels_.size(); ++i) {
      const AgrsLevel& level = levels_[i];
      if (!level.replicated) continue;
      add_before(i);
      sync_before_comm(*level.group);
      PhaseScope phase_scope(phase::kReduceScatter);
      level.group->all_reduce(partial.raw(), static_cast<size_t>(partial.numel()), DType::F32, ReduceOp::Sum);
    }
    std::vector<int64_t> inner_of;  // sources inside each gathering level, inner first
    int64_t inner = 1;
    for (const AgrsLevel& level : levels_)
      if (!level.replicated) {
        inner_of.push_back(inner);
        inner *= level.group->size();
      }
    size_t g = inner_of.size();
    for (auto it = levels_.rbegin(); it != levels_.rend(); ++it) {
      if (it->replicated) continue;
      add_before(static_cast<size_t>(levels_.rend() - it - 1));
      const int64_t in = inner_of[--g];
      const int n = it->group->size();
      const int64_t base = map.ep_rank / (in * n) * (in * n);
      std::vector<size_t> counts(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j)
        counts[static_cast<size_t>(j)] = static_cast<size_t>(rows_of(map, base + j * in, in) * width);
      Tensor mine = Tensor::empty(
          {static_cast<int64_t>(counts[static_cast<size_t>(it->group->rank())]) / width, width});
      sync_before_comm(*it->group);
      PhaseScope phase_scope(phase::kReduceScatter);
      it->group->reduce_scatter_v(partial.raw(), mine.raw(), counts, DType::F32);
      partial = std::move(mine);
    }
    return partial;
  }

  static void add_addend(Tensor& partial, const PathState::Agrs& io) {
    if (!io.combine_addend.defined()) return;
    const Tensor& a = io.combine_addend;
    EXPAR_CHECK(a.ndim() == 2 && a.dim(1) == partial.dim(1) && io.addend_row >= 0 &&
                    io.addend_row + a.dim(0) <= partial.dim(0),
                "agrs combine: an addend {} at row {} does not fit the partial output {}",
                shape_string(a.shape()), io.addend_row, shape_string(partial.shape()));
    float* p = partial.data<float>() + io.addend_row * partial.dim(1);
    const float* q = a.data<float>();
    const int64_t n = a.numel();  // once: numel() is out of line (per element, the loop would not vectorise)
    for (int64_t i = 0; i < n; ++i) p[i] += q[i];
  }

  // The routes of the gathered tokens that land on this rank's partition, as an EP-size-1 route map over
  // those tokens (every other route is -1 here: another partition serves it).
  static RouteMap local_view(const RouteMap& map, const Tensor& dst_rank, const Tensor& dst_row) {
    RouteMap v;
    v.tokens = dst_rank.dim(0);
    v.top_k = map.top_k;
    v.num_experts = map.num_experts;
    v.num_slots = map.num_slots;
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
      const bool here = row[i] >= 0 && rank[i] == map.partition;
      vr[i] = here ? 0 : -1;
      vw[i] = here ? row[i] : -1;
    }
    return v;
  }

  bool decode_;
  std::vector<AgrsLevel> levels_;
  int64_t gathering_sources_ = 1;
};

}  // namespace

std::unique_ptr<ExpertPath> make_agrs_path(Comm& ep_group, const PathOptions& options) {
  return std::make_unique<AgrsPath>(ep_group, options);
}

std::unique_ptr<ExpertPath> make_agrs_decode_path(Comm& ep_group, const PathOptions& options) {
  PathOptions decode = options;
  decode.agrs_decode = true;
  return std::make_unique<AgrsPath>(ep_group, decode);
}

}  // namespace expar
