#include "expar/topo/inference_layout.hpp"

#include <fmt/ranges.h>

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar {

namespace {

// The rules in the order they are checked; Ok when the configuration is accepted.
enum class InferenceRule : uint8_t {
  Ok,
  TpPositive,
  DpPositive,
  ExpertsPositive,
  EpPositive,
  RedundantNegative,
  EpWithoutFlag,
  RedundantWithoutEp,
  RedundantRoundRobin,
  WorldDivisible,
  EpWholeReplicas,
  ExpertsDivisible,
  IntermediatePositive,
  IntermediateDivisible
};

// The physical expert slots: the explicit table's, else one per expert and the redundant ones.
int slot_count(const InferenceConfig& c) {
  return c.expert_slots.empty() ? c.num_experts + c.redundant_experts
                                : static_cast<int>(c.expert_slots.size());
}

// With EP: the DP replicas one EP group joins (ep_degree = g * TP), 1 when it lies inside one replica.
int ep_dp_of(int tp, int ep) {
  return ep > tp ? ep / tp : 1;
}

// The ranks sharing one expert partition: the TP group without EP, else the copy's TP * ep_dp ranks over
// the ep_degree partitions (valid once ep_degree divides TP or is a multiple of it).
int ep_tp_of(const InferenceConfig& c, int ep) {
  return c.enable_expert_parallel ? c.tp * ep_dp_of(c.tp, ep) / ep : c.tp;
}

// The whole validation, without messages (cheap: find_layout_fixes runs it over many candidates).
InferenceRule broken_rule(const InferenceConfig& c) {
  if (c.tp < 1) return InferenceRule::TpPositive;
  if (c.dp < 1) return InferenceRule::DpPositive;
  if (c.num_experts < 1) return InferenceRule::ExpertsPositive;
  if (c.ep_degree && *c.ep_degree < 1) return InferenceRule::EpPositive;
  if (c.redundant_experts < 0) return InferenceRule::RedundantNegative;
  if (c.intermediate < 0) return InferenceRule::IntermediatePositive;
  const int world = c.tp * c.dp;
  if (!c.enable_expert_parallel) {
    if (c.ep_degree.value_or(1) != 1) return InferenceRule::EpWithoutFlag;
    if (c.redundant_experts > 0 || !c.expert_slots.empty()) return InferenceRule::RedundantWithoutEp;
  } else {
    const int ep = c.ep_degree.value_or(world);
    if (world % ep != 0) return InferenceRule::WorldDivisible;
    if (c.tp % ep != 0 && ep % c.tp != 0) return InferenceRule::EpWholeReplicas;
    if (slot_count(c) % ep != 0) return InferenceRule::ExpertsDivisible;
    if (slot_count(c) > c.num_experts && c.placement != PlacementKind::Contiguous)
      return InferenceRule::RedundantRoundRobin;
  }
  const int ep_tp = ep_tp_of(c, c.ep_degree.value_or(world));
  if (c.intermediate != 0 && c.intermediate % ep_tp != 0) return InferenceRule::IntermediateDivisible;
  return InferenceRule::Ok;
}

int effective_ep_degree(const InferenceConfig& c) {
  return c.ep_degree.value_or(c.enable_expert_parallel ? c.tp * c.dp : 1);
}

int setting_of(const InferenceConfig& c, const std::string& name) {
  if (name == "ep_degree") return effective_ep_degree(c);
  if (name == "data_parallel_size") return c.dp;
  if (name == "tensor_parallel_size") return c.tp;
  if (name == "redundant_experts") return c.redundant_experts;
  if (name == "placement") return c.placement == PlacementKind::Contiguous ? 0 : 1;
  EXPAR_ASSERT(name == "enable_expert_parallel", "unknown inference setting '{}'", name);
  return c.enable_expert_parallel ? 1 : 0;
}

InferenceConfig with_setting(InferenceConfig c, const std::string& name, int value) {
  if (name == "ep_degree") {
    c.ep_degree = value;
  } else if (name == "data_parallel_size") {
    c.dp = value;
  } else if (name == "tensor_parallel_size") {
    c.tp = value;
  } else if (name == "redundant_experts") {
    c.redundant_experts = value;
  } else if (name == "placement") {
    c.placement = value == 0 ? PlacementKind::Contiguous : PlacementKind::RoundRobin;
  } else {
    EXPAR_ASSERT(name == "enable_expert_parallel", "unknown inference setting '{}'", name);
    c.enable_expert_parallel = value != 0;
  }
  return c;
}

}  // namespace

std::optional<LayoutRefusal> inference_refusal(const InferenceConfig& c) {
  const InferenceRule rule = broken_rule(c);
  if (rule == InferenceRule::Ok) return std::nullopt;
  LayoutRefusal r;
  switch (rule) {
    case InferenceRule::TpPositive:
      r.rule = fmt::format("tensor_parallel_size={} must be at least 1", c.tp);
      return r;
    case InferenceRule::DpPositive:
      r.rule = fmt::format("data_parallel_size={} must be at least 1", c.dp);
      return r;
    case InferenceRule::ExpertsPositive:
      r.rule = fmt::format("num_experts={} must be at least 1", c.num_experts);
      return r;
    case InferenceRule::IntermediatePositive:
      r.rule = fmt::format("expert intermediate size {} must be at least 1", c.intermediate);
      return r;
    default:
      break;
  }
  const int world = c.tp * c.dp;
  const int ep = effective_ep_degree(c);
  const char* given = c.ep_degree ? "" : " (the default TP*DP with expert parallelism)";
  switch (rule) {
    case InferenceRule::EpPositive:
      r.rule = fmt::format("ep_degree={} must be at least 1", ep);
      break;
    case InferenceRule::EpWithoutFlag:
      r.rule = fmt::format("ep_degree={} requires expert parallelism", ep);
      break;
    case InferenceRule::RedundantNegative:
      r.rule = fmt::format("redundant_experts={} must be at least 0", c.redundant_experts);
      break;
    case InferenceRule::RedundantRoundRobin:
      r.rule = fmt::format(
          "placement {} lays out one slot per expert, but redundant_experts={} places the slots by "
          "DeepSeek's "
          "EPLB policy",
          placement_name(c.placement), slot_count(c) - c.num_experts);
      break;
    case InferenceRule::RedundantWithoutEp:
      r.rule = fmt::format(
          "redundant_experts={} requires expert parallelism: without it every rank holds every expert "
          "(sharded over TP), so there is nothing to replicate",
          slot_count(c) - c.num_experts);
      break;
    case InferenceRule::EpWholeReplicas:
      r.rule = fmt::format(
          "ep_degree={} with tensor_parallel_size={} and data_parallel_size={}: an EP group must lie inside "
          "one DP replica (ep_degree dividing TP={}) or join whole DP replicas (ep_degree = g*TP with g "
          "dividing DP={})",
          ep, c.tp, c.dp, c.tp, c.dp);
      break;
    case InferenceRule::WorldDivisible:
      r.rule =
          fmt::format("world_size={} (TP*DP={}*{}) is not divisible by ep_degree={}", world, c.tp, c.dp, ep);
      break;
    case InferenceRule::ExpertsDivisible:
      r.rule =
          slot_count(c) == c.num_experts
              ? fmt::format("num_experts={} is not divisible by ep_degree={}{}", c.num_experts, ep, given)
              : fmt::format(
                    "the {} expert slots (num_experts={} and redundant_experts={}) are not divisible by "
                    "ep_degree={}{}",
                    slot_count(c), c.num_experts, slot_count(c) - c.num_experts, ep, given);
      break;
    default: {
      const int ep_tp = ep_tp_of(c, ep);
      r.rule = fmt::format(
          "expert intermediate size {} is not divisible by the {} ranks of an EP_TP group ({}), which "
          "split it",
          c.intermediate, ep_tp,
          c.enable_expert_parallel ? fmt::format("TP {} / ep_degree {}", c.tp, ep)
                                   : fmt::format("the TP group: no expert parallelism"));
      break;
    }
  }
  // The settings a fix may change: TP also has to divide the model's heads, which this layout does not
  // know, so a fix changes it only when nothing else is accepted. Every range holds all values the rules
  // can accept: ep_degree divides the world (at most TP*DP); a DP that fixes anything either makes the
  // default ep_degree TP*DP divide the expert slots (so DP is at most the slots) or is a multiple of a given
  // ep_degree / TP, which the fix's period covers beyond the range.
  const int max_dp = std::max(c.dp, slot_count(c));
  std::vector<SettingRange> order = {{"ep_degree", 1, c.tp * max_dp}, {"data_parallel_size", 1, max_dp}};
  // The flag's other value: first when the flag is what is missing, last when it changes the EP_TP group.
  const int flag = c.enable_expert_parallel ? 0 : 1;
  if (rule == InferenceRule::EpWithoutFlag || rule == InferenceRule::RedundantWithoutEp)
    order.insert(order.begin(), {"enable_expert_parallel", flag, flag});
  if (rule == InferenceRule::IntermediateDivisible) order.push_back({"enable_expert_parallel", flag, flag});
  // Redundant experts: any R with (E + R) % ep_degree == 0 is accepted, so the candidates stop at
  // num_experts + ep_degree - 1, which always holds one; round-robin places no replicas.
  if (c.expert_slots.empty() && c.redundant_experts != 0) {
    order.push_back({"redundant_experts", 0, c.num_experts + std::max(1, ep) - 1});
    if (c.placement != PlacementKind::Contiguous) order.push_back({"placement", 0, 1});
  }
  auto accepted = [](const InferenceConfig& x) { return broken_rule(x) == InferenceRule::Ok; };
  r.fixes = find_layout_fixes(c, order, setting_of, with_setting, accepted);
  if (r.fixes.empty()) {
    // Only another TP is left (an intermediate size that neither EP nor DP lets the ranks split). Its
    // range holds every TP whose EP_TP group divides the intermediate size.
    const int hi = std::max(c.tp, c.intermediate) * std::max(1, ep);
    order.push_back({"tensor_parallel_size", 1, hi});
    r.fixes = find_layout_fixes(c, order, setting_of, with_setting, accepted);
    r.note = "TP must also divide the model's attention heads";
  }
  for (LayoutFix& f : r.fixes) {
    // A given ep_degree = g * TP joins g replicas per EP group, so every multiple of g is as good a DP as
    // the ones the range holds: the fix says so instead of listing an endless set.
    if (f.setting == "data_parallel_size") {
      InferenceConfig x = c;
      for (const auto& [name, value] : f.with) x = with_setting(x, name, value);
      if (x.enable_expert_parallel && x.ep_degree && *x.ep_degree % x.tp == 0) {
        f.period = *x.ep_degree / x.tp;
        // The first multiples; the period says the rest.
        f.values.resize(std::min<size_t>(f.values.size(), 3));
      }
    }
    if (!f.with.empty()) continue;
    if (f.setting == "enable_expert_parallel")
      f.phrase = f.values[0] == 1 ? "pass --enable-expert-parallel (enable_expert_parallel)"
                                  : "drop --enable-expert-parallel (enable_expert_parallel)";
    else if (f.setting == "ep_degree" && !c.enable_expert_parallel && f.values == std::vector<int>{1})
      f.phrase = "drop --ep (ep_degree=1: no expert parallelism)";
    else if (f.setting == "redundant_experts")
      f.phrase = f.values == std::vector<int>{0}
                     ? "drop --redundant-experts"
                     : fmt::format("choose --redundant-experts in {{{}}}{}", fmt::join(f.values, ","),
                                   f.values.front() == 0 ? " (0: none)" : "");
    else if (f.setting == "placement" && f.values == std::vector<int>{0})
      f.phrase = "drop --placement (contiguous)";
  }
  return r;
}

namespace {

int validated_ep_degree(const InferenceConfig& c) {
  if (auto refusal = inference_refusal(c)) throw Error(refusal->message());
  return effective_ep_degree(c);
}

// The explicit table, else R = 0's contiguous or round-robin placement, else (R > 0) DeepSeek's EPLB
// policy for a uniform load: a deterministic start that the first measured window then replaces.
ExpertPlacement initial_placement(const InferenceConfig& c, int ep_degree) {
  EXPAR_CHECK(c.expert_slots.empty() || c.redundant_experts == 0 ||
                  static_cast<int>(c.expert_slots.size()) == c.num_experts + c.redundant_experts,
              "the slot table has {} slots but num_experts={} and redundant_experts={} make {}: give one of "
              "them",
              c.expert_slots.size(), c.num_experts, c.redundant_experts, c.num_experts + c.redundant_experts);
  if (!c.expert_slots.empty()) return ExpertPlacement::from_slots(c.num_experts, ep_degree, c.expert_slots);
  if (c.redundant_experts == 0) return ExpertPlacement(c.num_experts, ep_degree, c.placement);
  ExpertBalanceInput in;
  in.loads.assign(static_cast<size_t>(c.num_experts), 1.0);
  in.redundant = c.redundant_experts;
  in.ep_size = ep_degree;
  return ExpertPlacement::from_balance(balance_experts(in));
}

}  // namespace

InferenceLayout::InferenceLayout(const InferenceConfig& config)
    : tp_(config.tp),
      dp_(config.dp),
      ep_enabled_(config.enable_expert_parallel),
      ep_degree_(validated_ep_degree(config)),
      placement_(initial_placement(config, ep_degree_)),
      config_(config) {}

InferenceLayout InferenceLayout::with_expert_slots(std::vector<int> slot_experts) const {
  InferenceConfig c = config_;
  c.expert_slots = std::move(slot_experts);
  c.redundant_experts = 0;
  return InferenceLayout(c);
}

int InferenceLayout::ep_dp_size() const {
  return ep_enabled_ ? ep_dp_of(tp_, ep_degree_) : 1;
}

int InferenceLayout::ep_tp_size() const {
  return copy_ranks() / ep_degree_;
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
    case InferenceGroup::EpDp: {
      const int first = rank / tp_ / ep_dp_size() * ep_dp_size();
      for (int d = first; d < first + ep_dp_size(); ++d) g.push_back(d * tp_ + rank % tp_);
      break;
    }
    case InferenceGroup::EpTp:
      // Without EP every rank holds all experts and the EP_TP group is the TP group (ep_tp = TP), which the
      // same block formula gives.
      for (int t = 0; t < ep_tp; ++t) g.push_back(rank / ep_tp * ep_tp + t);
      break;
    case InferenceGroup::Ep:
      if (!ep_enabled_) {
        g.push_back(rank);
      } else {
        const int copy = rank / copy_ranks() * copy_ranks();
        for (int e = 0; e < ep_degree_; ++e) g.push_back(copy + e * ep_tp + rank % ep_tp);
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
  info.expert_copy = rank / copy_ranks();
  info.ep_rank = ep_enabled_ ? rank % copy_ranks() / info.ep_tp_size : 0;
  info.local_experts = placement_.local_experts(info.ep_rank);
  return info;
}

std::pair<int, int> InferenceLayout::intermediate_shard(int rank, int intermediate) const {
  check_rank(rank);
  const int n = ep_tp_size();
  EXPAR_CHECK(intermediate >= 1, "expert intermediate size {} must be at least 1", intermediate);
  if (intermediate % n != 0) {
    InferenceConfig c = config_;
    c.intermediate = intermediate;
    throw Error(inference_refusal(c)->message());
  }
  const int r = rank % n;
  const int shard = intermediate / n;
  return {r * shard, (r + 1) * shard};
}

}  // namespace expar
