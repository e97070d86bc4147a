#include "expar/moe/capacity.hpp"

#include <algorithm>
#include <cmath>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

CapacityRule capacity_rule_from_name(const std::string& name) {
  if (name == "dropless" || name == "none") return CapacityRule::Dropless;
  if (name == "source") return CapacityRule::Source;
  if (name == "rank") return CapacityRule::Rank;
  if (name == "expert") return CapacityRule::Expert;
  fail("capacity rule '{}' is unknown: use 'dropless', 'source', 'rank' or 'expert'", name);
}

std::string capacity_rule_name(CapacityRule rule) {
  switch (rule) {
    case CapacityRule::Dropless:
      return "dropless";
    case CapacityRule::Source:
      return "source";
    case CapacityRule::Rank:
      return "rank";
    case CapacityRule::Expert:
      return "expert";
  }
  return "?";
}

std::vector<std::string> capacity_policy_names() {
  std::vector<std::string> names;
  for (CapacityRule r : {CapacityRule::Source, CapacityRule::Rank, CapacityRule::Expert})
    names.push_back(capacity_rule_name(r));
  return names;
}

void CapacityPolicy::validate() const {
  if (rule == CapacityRule::Dropless) return;
  EXPAR_CHECK(
      std::isfinite(capacity_factor) && capacity_factor > 0.0,
      "capacity factor cf={} with capacity rule '{}' must be a finite number > 0: use e.g. cf=1.25, or "
      "the 'dropless' rule for no capacity limit",
      capacity_factor, capacity_rule_name(rule));
}

int64_t ceil_rows(double x) {
  double forgiven = x - 1e-9 * std::max(1.0, std::fabs(x));
  return static_cast<int64_t>(std::ceil(forgiven));
}

CapacityPlan plan_capacity(std::span<const int64_t> requests, std::span<const int64_t> tokens, int top_k,
                           const ExpertPlacement& placement, const CapacityPolicy& policy) {
  policy.validate();
  // m sources; the placement's partitions are the destinations. Only the dropless rule is defined when they
  // differ (route_map.hpp: inference's agrs path with variable EP); the rules below size per-destination
  // budgets from the sources' tokens with one destination per source.
  const auto m = static_cast<int>(tokens.size());
  // The "experts" of every rule are the placement's slots (S = E without replicas; route_map.hpp).
  const int e_count = placement.num_slots();
  const int e_local = placement.local_count();
  EXPAR_CHECK(m == placement.ep_size() || policy.rule == CapacityRule::Dropless,
              "capacity plan: {} token counts for an EP group of {} (a group of sources other than the EP "
              "group takes only the dropless policy)",
              tokens.size(), placement.ep_size());
  EXPAR_ASSERT(requests.size() == static_cast<size_t>(m) * static_cast<size_t>(e_count),
               "capacity plan: request matrix has {} entries, expected {} ranks x {} experts",
               requests.size(), m, e_count);
  EXPAR_ASSERT(top_k >= 1 && top_k <= e_count, "top_k={} must be in [1, num_experts={}]", top_k, e_count);
  int64_t t_max = 0, dropless_bound = 0;
  for (int s = 0; s < m; ++s) {
    EXPAR_ASSERT(tokens[static_cast<size_t>(s)] >= 0, "rank {} reports {} tokens", s,
                 tokens[static_cast<size_t>(s)]);
    t_max = std::max(t_max, tokens[static_cast<size_t>(s)]);
    dropless_bound += tokens[static_cast<size_t>(s)] * std::min(top_k, e_local);
  }
  auto req = [&](int s, int e) {
    return requests[static_cast<size_t>(s) * e_count + static_cast<size_t>(e)];
  };

  CapacityPlan plan;
  plan.accepted.assign(requests.begin(), requests.end());
  auto acc = [&](int s, int e) -> int64_t& {
    return plan.accepted[static_cast<size_t>(s) * e_count + static_cast<size_t>(e)];
  };
  const double cf = policy.capacity_factor;
  const double k = static_cast<double>(top_k);
  int64_t rule_capacity = dropless_bound;
  switch (policy.rule) {
    case CapacityRule::Dropless:
      break;
    case CapacityRule::Source: {
      for (int s = 0; s < m; ++s) {
        const int64_t budget = ceil_rows(cf * static_cast<double>(tokens[static_cast<size_t>(s)]) * k / m);
        for (int r = 0; r < m; ++r) {
          int64_t left = budget;
          for (int l = 0; l < e_local; ++l) {
            const int e = placement.slot(r, l);
            acc(s, e) = std::min(req(s, e), left);
            left -= acc(s, e);
          }
        }
      }
      rule_capacity = m * ceil_rows(cf * static_cast<double>(t_max) * k / m);
      break;
    }
    case CapacityRule::Rank: {
      const int64_t cap = std::max<int64_t>(1, ceil_rows(cf * static_cast<double>(t_max) * k));
      for (int r = 0; r < m; ++r) {
        int64_t left = cap;
        for (int l = 0; l < e_local; ++l) {
          const int e = placement.slot(r, l);
          for (int s = 0; s < m; ++s) {
            acc(s, e) = std::min(req(s, e), left);
            left -= acc(s, e);
          }
        }
      }
      rule_capacity = cap;
      break;
    }
    case CapacityRule::Expert: {
      for (int s = 0; s < m; ++s) {
        const int64_t per_expert =
            ceil_rows(cf * static_cast<double>(tokens[static_cast<size_t>(s)]) * k / e_count);
        for (int e = 0; e < e_count; ++e) acc(s, e) = std::min(req(s, e), per_expert);
      }
      rule_capacity =
          static_cast<int64_t>(m) * e_local * ceil_rows(cf * static_cast<double>(t_max) * k / e_count);
      break;
    }
  }
  plan.capacity_rows = std::min(rule_capacity, dropless_bound);
  return plan;
}

int64_t max_capacity_rows(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                          const CapacityPolicy& policy) {
  EXPAR_ASSERT(max_tokens_per_rank >= 0, "max_tokens_per_rank={} must not be negative", max_tokens_per_rank);
  const auto m = static_cast<size_t>(placement.ep_size());
  const std::vector<int64_t> requests(m * static_cast<size_t>(placement.num_slots()), 0);
  const std::vector<int64_t> tokens(m, max_tokens_per_rank);
  return plan_capacity(requests, tokens, top_k, placement, policy).capacity_rows;
}

}  // namespace expar
