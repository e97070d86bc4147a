#include "expar/topo/inference_layout.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/divisors.hpp"

namespace expar {

namespace {

// The EP degrees that satisfy both divisibility rules for this world and expert count.
std::vector<int> valid_ep_degrees(int world, int num_experts) {
  std::vector<int> out;
  for (int d : divisors(world))
    if (num_experts % d == 0) out.push_back(d);
  return out;
}

// Runs every rule before the members are built, so the constructor's initializer list stays simple.
int validated_ep_degree(const InferenceConfig& c) {
  EXPAR_CHECK(c.tp >= 1, "tensor_parallel_size={} must be at least 1", c.tp);
  EXPAR_CHECK(c.dp >= 1, "data_parallel_size={} must be at least 1", c.dp);
  EXPAR_CHECK(c.num_experts >= 1, "num_experts={} must be at least 1", c.num_experts);
  const int world = c.tp * c.dp;
  if (c.ep_degree) {
    EXPAR_CHECK(*c.ep_degree >= 1,
                "ep_degree={} must be at least 1: omit it for the default ep_degree=TP*DP={}", *c.ep_degree,
                world);
  }
  if (!c.enable_expert_parallel) {
    EXPAR_CHECK(!c.ep_degree || *c.ep_degree == 1,
                "ep_degree={} requires expert parallelism: pass --enable-expert-parallel "
                "(enable_expert_parallel in the options; ep_degree then defaults to TP*DP={}) or drop --ep "
                "(ep_degree)",
                *c.ep_degree, world);
    return 1;
  }
  const int ep = c.ep_degree.value_or(world);
  if (c.dp > 1) {
    EXPAR_CHECK(
        ep == world,
        "ep_degree={} with data_parallel_size={}: cross-DP EP must span all ranks, ep_degree must equal "
        "TP*DP={}*{}={}; set ep_degree={} or omit it",
        ep, c.dp, c.tp, c.dp, world, world);
  }
  EXPAR_CHECK(world % ep == 0,
              "world_size={} (TP*DP={}*{}) is not divisible by ep_degree={}: choose ep_degree in {{{}}}",
              world, c.tp, c.dp, ep, fmt::join(valid_ep_degrees(world, c.num_experts), ","));
  EXPAR_CHECK(c.num_experts % ep == 0,
              "num_experts={} is not divisible by ep_degree={}: choose ep_degree in {{{}}}", c.num_experts,
              ep, fmt::join(valid_ep_degrees(world, c.num_experts), ","));
  return ep;
}

}  // namespace

InferenceLayout::InferenceLayout(const InferenceConfig& config)
    : tp_(config.tp),
      dp_(config.dp),
      ep_enabled_(config.enable_expert_parallel),
      ep_degree_(validated_ep_degree(config)),
      placement_(config.num_experts, ep_degree_, config.placement) {}

int InferenceLayout::ep_tp_size() const {
  return ep_enabled_ ? world() / ep_degree_ : tp_;
}

void InferenceLayout::check_rank(int rank) const {
  EXPAR_ASSERT(rank >= 0 && rank < world(), "rank {} is out of range [0, {}): world is TP*DP={}*{}", rank,
               world(), tp_, dp_);
}

std::vector<int> InferenceLayout::group_of(int rank, InferenceGroup kind) const {
  check_rank(rank);
  std::vector<int> g;
  const int ep_tp = ep_tp_size();
  switch (kind) {
    case InferenceGroup::Tp:
      for (int t = 0; t < tp_; ++t) g.push_back(rank / tp_ * tp_ + t);
      break;
    case InferenceGroup::Dp:
      for (int d = 0; d < dp_; ++d) g.push_back(d * tp_ + rank % tp_);
      break;
    case InferenceGroup::EpTp:
      // Without EP every rank holds all experts and the EP_TP group is the TP group (ep_tp = TP), which the
      // same block formula gives.
      for (int t = 0; t < ep_tp; ++t) g.push_back(rank / ep_tp * ep_tp + t);
      break;
    case InferenceGroup::Ep:
      if (!ep_enabled_) {
        g.push_back(rank);
      } else {
        for (int e = 0; e < ep_degree_; ++e) g.push_back(e * ep_tp + rank % ep_tp);
      }
      break;
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<std::vector<int>> InferenceLayout::groups(InferenceGroup kind) const {
  std::vector<std::vector<int>> out;
  std::vector<char> covered(static_cast<size_t>(world()), 0);
  for (int r = 0; r < world(); ++r) {
    if (covered[static_cast<size_t>(r)]) continue;
    auto g = group_of(r, kind);
    for (int m : g) covered[static_cast<size_t>(m)] = 1;
    out.push_back(std::move(g));
  }
  return out;
}

InferenceRankInfo InferenceLayout::rank_info(int rank) const {
  check_rank(rank);
  InferenceRankInfo info;
  info.rank = rank;
  info.tp_rank = rank % tp_;
  info.dp_rank = rank / tp_;
  info.ep_tp_size = ep_tp_size();
  info.ep_tp_rank = rank % info.ep_tp_size;
  info.ep_rank = ep_enabled_ ? rank / info.ep_tp_size : 0;
  info.local_experts = placement_.local_experts(info.ep_rank);
  return info;
}

std::pair<int, int> InferenceLayout::intermediate_shard(int rank, int intermediate) const {
  check_rank(rank);
  const int n = ep_tp_size();
  EXPAR_CHECK(
      intermediate >= 1 && intermediate % n == 0,
      "expert intermediate size {} is not divisible by the {} ranks of an EP_TP group (world {} / ep_degree "
      "{}): choose ep_degree so that world/ep_degree divides {}",
      intermediate, n, world(), ep_degree_, intermediate);
  const int r = rank % n;
  const int shard = intermediate / n;
  return {r * shard, (r + 1) * shard};
}

}  // namespace expar
