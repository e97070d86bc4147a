#include "expar/topo/training_layout.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

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

namespace {

enum class TrainingRule : uint8_t {
  Ok,
  Positive,
  PpDividesLayers,
  TpDividesHeads,
  DenseDpWhole,
  EpMpDividesStage,
  EpMpDividesExperts
};

// The whole validation, without messages (cheap: find_layout_fixes runs it over many candidates).
TrainingRule broken_rule(const TrainingLayoutConfig& c) {
  if (c.world < 1 || c.cp < 1 || c.tp < 1 || c.pp < 1 || c.ep_mp < 1) return TrainingRule::Positive;
  if (c.layers > 0 && c.layers % c.pp != 0) return TrainingRule::PpDividesLayers;
  if (c.heads > 0 && c.heads % c.tp != 0) return TrainingRule::TpDividesHeads;
  if (c.world % (c.cp * c.tp * c.pp) != 0) return TrainingRule::DenseDpWhole;
  if (c.world / c.pp % c.ep_mp != 0) return TrainingRule::EpMpDividesStage;
  if (c.num_experts > 0 && c.num_experts % c.ep_mp != 0) return TrainingRule::EpMpDividesExperts;
  return TrainingRule::Ok;
}

int& field(TrainingLayoutConfig& c, const std::string& name) {
  if (name == "M_E") return c.ep_mp;
  if (name == "C") return c.cp;
  if (name == "TP") return c.tp;
  EXPAR_ASSERT(name == "PP", "unknown training layout setting '{}'", name);
  return c.pp;
}

std::string positive_rule(const TrainingLayoutConfig& c) {
  for (auto [v, what] : {std::pair{c.world, "world size W"},
                         {c.cp, "context-parallel degree C"},
                         {c.tp, "tensor-parallel degree TP"},
                         {c.pp, "pipeline stages PP"},
                         {c.ep_mp, "EP_MP degree M_E"}})
    if (v < 1) return fmt::format("{}={} must be at least 1", what, v);
  return "";
}

}  // namespace

std::optional<LayoutRefusal> training_layout_refusal(const TrainingLayoutConfig& c) {
  const TrainingRule rule = broken_rule(c);
  if (rule == TrainingRule::Ok) return std::nullopt;
  LayoutRefusal r;
  std::vector<SettingRange> order = {
      {"M_E", 1, c.world}, {"C", 1, c.world}, {"TP", 1, c.world}, {"PP", 1, c.world}};
  auto first = [&order](const std::string& name) {
    std::stable_partition(order.begin(), order.end(), [&](const SettingRange& s) { return s.name == name; });
  };
  switch (rule) {
    case TrainingRule::Positive:
      // The world size is the ranks one has: below 1 there is nothing to suggest.
      r.rule = positive_rule(c);
      if (c.world < 1) return r;
      break;
    case TrainingRule::PpDividesLayers:
      r.rule =
          fmt::format("pipeline stages PP={} does not divide the {} layers of '{}'", c.pp, c.layers, c.model);
      first("PP");
      break;
    case TrainingRule::TpDividesHeads:
      r.rule = fmt::format("tensor-parallel degree TP={} does not divide the {} attention heads of '{}'",
                           c.tp, c.heads, c.model);
      first("TP");
      break;
    case TrainingRule::DenseDpWhole:
      r.rule = fmt::format(
          "world size W={} is not divisible by C*TP*PP={}*{}*{}={}: the dense data-parallel degree "
          "D=W/(C*TP*PP) must be whole",
          c.world, c.cp, c.tp, c.pp, c.cp * c.tp * c.pp);
      first("C");
      break;
    case TrainingRule::EpMpDividesStage: {
      const int dp = c.world / (c.cp * c.tp * c.pp);
      r.rule = fmt::format(
          "EP_MP degree M_E={} does not divide the D*C*TP={}*{}*{}={} ranks of a pipeline stage (eq. 8 with "
          "CP "
          "folding: D*C = M_E*D_E)",
          c.ep_mp, dp, c.cp, c.tp, dp * c.cp * c.tp);
      break;
    }
    default:
      r.rule = fmt::format("num_experts={} is not divisible by EP_MP degree M_E={}", c.num_experts, c.ep_mp);
      break;
  }
  r.fixes = find_layout_fixes(
      c, order, [](TrainingLayoutConfig x, const std::string& name) { return field(x, name); },
      [](TrainingLayoutConfig x, const std::string& name, int value) {
        field(x, name) = value;
        return x;
      },
      [](const TrainingLayoutConfig& x) { return broken_rule(x) == TrainingRule::Ok; });
  if (!r.fixes.empty() && r.fixes[0].setting != order[0].name)
    r.note = fmt::format("no {} alone is accepted with the other settings", order[0].name);
  return r;
}

TrainingLayout::TrainingLayout(const TrainingLayoutConfig& c)
    : world(c.world), cp(c.cp), tp(c.tp), pp(c.pp), dp(0), ep_mp(c.ep_mp), ep_dp(0), stage_size(0) {
  if (auto refusal = training_layout_refusal(c)) throw Error(refusal->message());
  dp = world / (cp * tp * pp);
  stage_size = dp * cp * tp;
  ep_dp = stage_size / ep_mp;
}

TrainingLayout::TrainingLayout(int world_, int ep_mp_, int cp_, int tp_, int pp_)
    : TrainingLayout(TrainingLayoutConfig{world_, ep_mp_, cp_, tp_, pp_}) {}

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
  // The placement alone would suggest every divisor of num_experts, most of which this layout refuses.
  TrainingLayoutConfig c{world, ep_mp, cp, tp, pp};
  c.num_experts = num_experts;
  if (num_experts >= 1)
    if (auto refusal = training_layout_refusal(c)) throw Error(refusal->message());
  return ExpertPlacement(num_experts, ep_mp, kind);
}

std::vector<int> TrainingLayout::local_experts(int rank, int num_experts, PlacementKind kind) const {
  return expert_placement(num_experts, kind).local_experts(coords(rank).ep_mp);
}

}  // namespace expar
