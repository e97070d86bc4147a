#pragma once
// Capacity policy: which routes are accepted, decided before any row moves (seed 000 §5.4, §10.3).
//
// Every rule is a pure function of the REQUEST matrix req[s][e] (routes from source rank s to expert e over
// the EP group) and each source's token count T_s, so every rank of the group computes the same ACCEPTED
// matrix acc[s][e] from one all-gather of counts. Source s then accepts its first acc[s][e] routes to expert
// e in (token, k) order. M = EP group size, E_L = E / M, K = top-k, T_max = max_s T_s.
//
//  - dropless: acc = req.
//  - source (seed 000 Figures 15/16): source s may place at most B_s = ceil(cf·T_s·K/M) rows into each
//    destination rank, granted to its routes to that destination in local-expert-major order (then (token,
//    k) order inside an expert). Per-destination capacity: M·ceil(cf·T_max·K/M).
//  - rank: at most C = max(1, ceil(cf·T_max·K)) rows per destination rank, granted
//    in local-expert-major, then source-rank, then (token, k) order, so lower source ranks win.
//  - expert (Switch/Megatron): at most c_s = ceil(cf·T_s·K/E) rows per (source, expert). Per-destination
//    capacity: M·E_L·ceil(cf·T_max·K/E).
//
// With redundant experts (topo/placement.hpp) every rule runs on the slot request matrix: e is a physical
// slot, E the slot count S and E_L the slots per rank (a replicated expert gets each replica's share).
//
// Buffer capacity (rows of every rank's expert-side buffer; the same on all ranks so that buffers can be
// symmetric): the rule's per-destination capacity, but never more than the dropless bound Σ_s T_s·min(K, E_L)
// (a token's K experts are distinct, so at most min(K, E_L) of its routes reach one rank). Dropless uses that
// bound alone. Both are upper bounds on the rows any rank can receive, so the smaller one is safe.
//
// Products cf·T·K are rounded up after forgiving a relative 1e-9, so that a decimal cf such as 1.2 that is
// not exact in binary still gives ceil(1.2·5·2/2) = 6, as the decimal arithmetic says.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "expar/topo/placement.hpp"

namespace expar {

enum class CapacityRule : uint8_t { Dropless, Source, Rank, Expert };
// "dropless" | "source" | "rank" | "expert"
CapacityRule capacity_rule_from_name(const std::string& name);
std::string capacity_rule_name(CapacityRule rule);
// The rules that take a capacity factor (all but dropless, which is a factor of 0), by name: the choices
// of the command line's --capacity-policy.
std::vector<std::string> capacity_policy_names();

struct CapacityPolicy {
  CapacityRule rule = CapacityRule::Dropless;
  double capacity_factor = 0.0;  // cf; required (> 0) for every rule except dropless

  static CapacityPolicy dropless() { return {}; }
  static CapacityPolicy with(CapacityRule rule, double cf) { return {rule, cf}; }
  // Throws expar::Error for a non-dropless rule with cf <= 0 (or not finite).
  void validate() const;
};

// ceil(x), forgiving a relative 1e-9 above an integer.
int64_t ceil_rows(double x);

struct CapacityPlan {
  std::vector<int64_t> accepted;  // [M x E], row-major by source rank
  int64_t capacity_rows = 0;      // rows of each rank's expert-side buffer (identical on every rank)
};

// requests: [M x E] (source-major), tokens: [M] (T_s). Pure and deterministic.
CapacityPlan plan_capacity(std::span<const int64_t> requests, std::span<const int64_t> tokens, int top_k,
                           const ExpertPlacement& placement, const CapacityPolicy& policy);

// The largest capacity_rows plan_capacity can give when no rank has more than max_tokens_per_rank tokens
// (capacity_rows grows with every T_s, so it is the plan with every T_s = max_tokens_per_rank): what a
// buffer that must hold any step's expert-side rows is sized by. With a capacity factor it stays about
// cf*T*K as M_E grows (seed 000 §5.1); dropless, it is the bound M_E*T*min(K, E_L).
int64_t max_capacity_rows(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                          const CapacityPolicy& policy);

}  // namespace expar
