#include "expar/topo/training_layout.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/divisors.hpp"

namespace expar {

std::string training_group_name(TrainingGroup kind) {
  switch (kind) {
    case TrainingGroup::Dp:
      return "dp";
    case TrainingGroup::Cp:
      return "cp";
    case TrainingGroup::Tp:
      return "tp";
    case TrainingGroup::Pp:
      return "pp";
    case TrainingGroup::DenseGrad:
      return "dense_grad";
    case TrainingGroup::EpMp:
      return "ep_mp";
    case TrainingGroup::EpDp:
      return "ep_dp";
  }
  return "?";
}

TrainingLayout::TrainingLayout(int world_, int ep_mp_, int cp_, int tp_, int pp_)
    : world(world_), cp(cp_), tp(tp_), pp(pp_), dp(0), ep_mp(ep_mp_), ep_dp(0), stage_size(0) {
  EXPAR_CHECK(world >= 1, "world size W={} must be at least 1", world);
  EXPAR_CHECK(cp >= 1, "context-parallel degree C={} must be at least 1", cp);
  EXPAR_CHECK(tp >= 1, "tensor-parallel degree TP={} must be at least 1", tp);
  EXPAR_CHECK(pp >= 1, "pipeline stages PP={} must be at least 1", pp);
  EXPAR_CHECK(ep_mp >= 1, "EP_MP degree M_E={} must be at least 1", ep_mp);
  const int non_dp = cp * tp * pp;
  EXPAR_CHECK(world % non_dp == 0,
              "world size W={} is not divisible by C*TP*PP={}*{}*{}={}: the dense data-parallel degree "
              "D=W/(C*TP*PP) must be whole; choose C*TP*PP in {{{}}}",
              world, cp, tp, pp, non_dp, fmt::join(divisors(world), ","));
  dp = world / non_dp;
  stage_size = dp * cp * tp;
  EXPAR_CHECK(
      stage_size % ep_mp == 0,
      "EP_MP degree M_E={} does not divide the D*C*TP={}*{}*{}={} ranks of a pipeline stage (eq. 8 with CP "
      "folding: D*C = M_E*D_E): choose M_E in {{{}}}",
      ep_mp, dp, cp, tp, stage_size, fmt::join(divisors(stage_size), ","));
  ep_dp = stage_size / ep_mp;
}

void TrainingLayout::check_rank(int rank) const {
  EXPAR_ASSERT(rank >= 0 && rank < world, "rank {} is out of range [0, {}): world size is {}", rank, world,
               world);
}

int TrainingLayout::rank_of(int stage, int dp_index, int cp_index, int tp_index) const {
  EXPAR_ASSERT(stage >= 0 && stage < pp && dp_index >= 0 && dp_index < dp && cp_index >= 0 && cp_index < cp &&
                   tp_index >= 0 && tp_index < tp,
               "coordinates (stage={}, dp={}, cp={}, tp={}) are out of range (PP={}, D={}, C={}, TP={})",
               stage, dp_index, cp_index, tp_index, pp, dp, cp, tp);
  return stage * stage_size + (dp_index * cp + cp_index) * tp + tp_index;
}

int TrainingLayout::rank_of_expert_coords(int stage, int ep_dp_index, int ep_mp_index) const {
  EXPAR_ASSERT(stage >= 0 && stage < pp && ep_dp_index >= 0 && ep_dp_index < ep_dp && ep_mp_index >= 0 &&
                   ep_mp_index < ep_mp,
               "expert coordinates (stage={}, ep_dp={}, ep_mp={}) are out of range (PP={}, D_E={}, M_E={})",
               stage, ep_dp_index, ep_mp_index, pp, ep_dp, ep_mp);
  return stage * stage_size + ep_dp_index * ep_mp + ep_mp_index;
}

TrainingCoords TrainingLayout::coords(int rank) const {
  check_rank(rank);
  TrainingCoords c;
  c.stage = rank / stage_size;
  const int s = rank % stage_size;
  c.tp = s % tp;
  c.cp = (s / tp) % cp;
  c.dp = s / (tp * cp);
  c.ep_mp = s % ep_mp;
  c.ep_dp = s / ep_mp;
  return c;
}

int TrainingLayout::group_size(TrainingGroup kind) const {
  switch (kind) {
    case TrainingGroup::Dp:
      return dp;
    case TrainingGroup::Cp:
      return cp;
    case TrainingGroup::Tp:
      return tp;
    case TrainingGroup::Pp:
      return pp;
    case TrainingGroup::DenseGrad:
      return dp * cp;
    case TrainingGroup::EpMp:
      return ep_mp;
    case TrainingGroup::EpDp:
      return ep_dp;
  }
  return 0;
}

std::vector<int> TrainingLayout::group_of(int rank, TrainingGroup kind) const {
  const TrainingCoords c = coords(rank);
  std::vector<int> g;
  switch (kind) {
    case TrainingGroup::Dp:
      for (int d = 0; d < dp; ++d) g.push_back(rank_of(c.stage, d, c.cp, c.tp));
      break;
    case TrainingGroup::Cp:
      for (int x = 0; x < cp; ++x) g.push_back(rank_of(c.stage, c.dp, x, c.tp));
      break;
    case TrainingGroup::Tp:
      for (int t = 0; t < tp; ++t) g.push_back(rank_of(c.stage, c.dp, c.cp, t));
      break;
    case TrainingGroup::Pp:
      for (int p = 0; p < pp; ++p) g.push_back(rank_of(p, c.dp, c.cp, c.tp));
      break;
    case TrainingGroup::DenseGrad:
      for (int d = 0; d < dp; ++d)
        for (int x = 0; x < cp; ++x) g.push_back(rank_of(c.stage, d, x, c.tp));
      break;
    case TrainingGroup::EpMp:
      for (int m = 0; m < ep_mp; ++m) g.push_back(rank_of_expert_coords(c.stage, c.ep_dp, m));
      break;
    case TrainingGroup::EpDp:
      for (int e = 0; e < ep_dp; ++e) g.push_back(rank_of_expert_coords(c.stage, e, c.ep_mp));
      break;
  }
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<std::vector<int>> TrainingLayout::groups(TrainingGroup kind) const {
  // Walking ranks in order and starting a group at each rank not yet covered yields groups ordered by their
  // smallest member.
  std::vector<std::vector<int>> out;
  std::vector<char> covered(static_cast<size_t>(world), 0);
  for (int r = 0; r < world; ++r) {
    if (covered[static_cast<size_t>(r)]) continue;
    auto g = group_of(r, kind);
    for (int m : g) covered[static_cast<size_t>(m)] = 1;
    out.push_back(std::move(g));
  }
  return out;
}

ExpertPlacement TrainingLayout::expert_placement(int num_experts, PlacementKind kind) const {
  return ExpertPlacement(num_experts, ep_mp, kind);
}

std::vector<int> TrainingLayout::local_experts(int rank, int num_experts, PlacementKind kind) const {
  return expert_placement(num_experts, kind).local_experts(coords(rank).ep_mp);
}

}  // namespace expar
