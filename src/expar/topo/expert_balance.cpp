#include "expar/topo/expert_balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>
#include <utility>

#include "expar/core/error.hpp"
#include "expar/topo/divisors.hpp"

namespace expar {

namespace {

void validate(const ExpertBalanceInput& in) {
  const int64_t experts = static_cast<int64_t>(in.loads.size());
  EXPAR_CHECK(experts >= 1, "no expert loads given: give one load per logical expert (e.g. 8,1,1,2)");
  EXPAR_CHECK(experts <= (1 << 24), "{} expert loads is more than the {} experts a placement takes", experts,
              1 << 24);
  for (size_t e = 0; e < in.loads.size(); ++e) {
    const double load = in.loads[e];
    EXPAR_CHECK(std::isfinite(load) && load >= 0,
                "the load of expert {} is {}: a load counts tokens routed to the expert, so it is a finite "
                "number >= 0: give 0 or more",
                e, load);
  }
  const double total = std::accumulate(in.loads.begin(), in.loads.end(), 0.0);
  EXPAR_CHECK(std::isfinite(total),
              "the {} expert loads add up to {}, beyond what a double holds: give loads with a finite sum "
              "(scale them down: only their ratios matter)",
              experts, total);
  const int e_count = static_cast<int>(experts);
  EXPAR_CHECK(in.redundant >= 0,
              "redundant experts R={} is negative: R counts the slots beyond one per expert: give R >= 0 "
              "(0: no replicas)",
              in.redundant);
  EXPAR_CHECK(in.redundant <= (1 << 24) - e_count, "redundant experts R={} gives more than {} slots",
              in.redundant, 1 << 24);
  EXPAR_CHECK(in.ep_size >= 1, "EP group size M={} must be at least 1", in.ep_size);
  const int m = in.ep_size, s = e_count + in.redundant;
  if (s % m != 0) {
    const int first = (m - e_count % m) % m;
    fail(
        "S = E + R = {} + {} = {} physical expert slots are not divisible by the EP group size M={}: every "
        "rank holds the same number of slots: choose redundant experts R (--redundant-experts) in {{{}, {}, "
        "{}, ...}} (R = {} mod {})",
        e_count, in.redundant, s, m, first, first + m, first + 2 * m, first, m);
  }
  const int k = in.ranks_per_node;
  EXPAR_CHECK(k >= 0, "ranks per node K={} is negative: give K >= 1 (or none: no nodes)", k);
  EXPAR_CHECK(k == 0 || m <= k || m % k == 0,
              "the EP group of M={} ranks neither fits in one node of K={} ranks nor fills whole nodes "
              "(M % K = {}): choose ranks per node K (--ranks-per-node) in {{{}}} or K >= {}",
              m, k, m % k, fmt::join(divisors(m), ","), m);
  const int g = in.expert_groups;
  EXPAR_CHECK(g >= 0, "expert groups G={} is negative: give G >= 1 (or 0: one group per expert)", g);
  EXPAR_CHECK(g == 0 || e_count % g == 0,
              "E={} experts do not split into G={} equal groups of consecutive experts: choose expert "
              "groups G (--expert-groups) in {{{}}}",
              e_count, g, fmt::join(divisors(e_count), ","));
}

// Replica counts for items with `loads`, `slots` >= loads.size() in all: one each, then one more at a
// time to the highest load per replica (ties: the lower index).
std::vector<int> replicate(const std::vector<double>& loads, int slots) {
  std::vector<int> count(loads.size(), 1);
  using Entry = std::pair<double, int>;  // (load per replica, index)
  auto after = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(after)> heap(after);
  for (size_t i = 0; i < loads.size(); ++i) heap.emplace(loads[i], static_cast<int>(i));
  for (int extra = static_cast<int>(loads.size()); extra < slots; ++extra) {
    const int i = heap.top().second;
    heap.pop();
    const size_t at = static_cast<size_t>(i);
    ++count[at];
    heap.emplace(loads[at] / count[at], i);
  }
  return count;
}

// Bins for items of `weights`, `capacity` items per bin, heaviest first (ties: the lower index) onto the
// least-loaded bin with room (ties: the lower bin), skipping bins that hold an item of the same label
// while another bin with room does not. A label < 0 is never skipped.
std::vector<int> pack(const std::vector<double>& weights, const std::vector<int>& labels, int bins,
                      int capacity) {
  std::vector<int> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)];
  });
  std::set<std::pair<double, int>> open;  // (load, bin) of bins with room
  for (int b = 0; b < bins; ++b) open.emplace(0.0, b);
  std::vector<int> filled(static_cast<size_t>(bins), 0);
  std::set<std::pair<int, int>> held;  // (label, bin)
  std::vector<int> bin_of(weights.size(), -1);
  for (int item : order) {
    const size_t at = static_cast<size_t>(item);
    const int label = labels[at];
    auto chosen = open.begin();
    if (label >= 0) {
      auto it = std::find_if(open.begin(), open.end(), [&](const auto& entry) {
        return !held.contains({label, entry.second});
      });
      if (it != open.end()) chosen = it;
    }
    const auto [load, bin] = *chosen;
    open.erase(chosen);
    bin_of[at] = bin;
    if (label >= 0) held.emplace(label, bin);
    if (++filled[static_cast<size_t>(bin)] < capacity) open.emplace(load + weights[at], bin);
  }
  return bin_of;
}

}  // namespace

double load_imbalance(const std::vector<double>& rank_load) {
  if (rank_load.empty()) return 0;
  double total = 0, most = 0;
  for (double l : rank_load) {
    total += l;
    most = std::max(most, l);
  }
  const double mean = total / static_cast<double>(rank_load.size());
  // max >= mean; summation rounding may say otherwise by an ulp, never below 0.
  return mean > 0 ? std::max(0.0, (most - mean) / mean) : 0;
}

LayerImbalance layer_imbalance(const std::vector<std::vector<double>>& rows_by_rank) {
  size_t layers = 0;
  for (const std::vector<double>& rank : rows_by_rank) layers = std::max(layers, rank.size());
  LayerImbalance out;
  int with_rows = 0;
  for (size_t l = 0; l < layers; ++l) {
    std::vector<double> ranks;
    for (const std::vector<double>& rank : rows_by_rank) ranks.push_back(l < rank.size() ? rank[l] : 0.0);
    out.per_layer.push_back(load_imbalance(ranks));
    if (std::all_of(ranks.begin(), ranks.end(), [](double x) { return x == 0; })) continue;
    out.mean += out.per_layer.back();
    out.largest = std::max(out.largest, out.per_layer.back());
    ++with_rows;
  }
  if (with_rows > 0) out.mean /= with_rows;
  return out;
}

std::vector<int> ExpertBalance::rank_slots(int rank) const {
  std::vector<int> out(static_cast<size_t>(slots_per_rank));
  std::iota(out.begin(), out.end(), rank * slots_per_rank);
  return out;
}

ExpertBalance balance_experts(const ExpertBalanceInput& in) {
  validate(in);
  ExpertBalance out;
  const int e_count = static_cast<int>(in.loads.size());
  const int m = in.ep_size, s = e_count + in.redundant;
  out.num_experts = e_count;
  out.num_slots = s;
  out.ep_size = m;
  out.slots_per_rank = s / m;
  out.expert_groups = in.expert_groups > 0 ? in.expert_groups : e_count;
  const int groups = out.expert_groups;
  if (in.ranks_per_node > 0 && m > in.ranks_per_node) out.nodes = m / in.ranks_per_node;
  out.node_first = out.nodes > 1 && groups % out.nodes == 0;
  if (out.nodes > 1 && !out.node_first)
    out.policy_note = fmt::format(
        "the G={} expert groups do not divide over the {} nodes: the global policy (as DeepSeek's EPLB "
        "falls back)",
        groups, out.nodes);
  const int nodes = out.node_first ? out.nodes : 1;

  // The experts of each node: whole groups packed by group load, or every expert on the one node.
  std::vector<std::vector<int>> node_experts(static_cast<size_t>(nodes));
  const int group_size = e_count / groups;
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (int e = 0; e < e_count; ++e)
    group_load[static_cast<size_t>(e / group_size)] += in.loads[static_cast<size_t>(e)];
  const std::vector<int> node_of_group =
      nodes > 1 ? pack(group_load, std::vector<int>(static_cast<size_t>(groups), -1), nodes, groups / nodes)
                : std::vector<int>(static_cast<size_t>(groups), 0);
  for (int e = 0; e < e_count; ++e)
    node_experts[static_cast<size_t>(node_of_group[static_cast<size_t>(e / group_size)])].push_back(e);

  // Replicate inside each node, then pack onto its ranks.
  const int node_ranks = m / nodes, node_slots = s / nodes;
  std::vector<PhysicalSlot> placed;
  for (int n = 0; n < nodes; ++n) {
    const std::vector<int>& experts = node_experts[static_cast<size_t>(n)];
    std::vector<double> loads;
    for (int e : experts) loads.push_back(in.loads[static_cast<size_t>(e)]);
    const std::vector<int> count = replicate(loads, node_slots);
    std::vector<PhysicalSlot> items;
    std::vector<double> weights;
    std::vector<int> labels;
    for (size_t i = 0; i < experts.size(); ++i)
      for (int r = 0; r < count[i]; ++r) {
        items.push_back({experts[i], r, 0, loads[i] / count[i]});
        weights.push_back(items.back().load);
        labels.push_back(experts[i]);
      }
    const std::vector<int> rank_in_node = pack(weights, labels, node_ranks, out.slots_per_rank);
    for (size_t i = 0; i < items.size(); ++i) {
      items[i].rank = n * node_ranks + rank_in_node[i];
      placed.push_back(items[i]);
    }
  }
  std::stable_sort(placed.begin(), placed.end(), [](const PhysicalSlot& a, const PhysicalSlot& b) {
    return std::tie(a.rank, a.expert, a.replica) < std::tie(b.rank, b.expert, b.replica);
  });
  out.slots = std::move(placed);
  out.replicas.assign(static_cast<size_t>(e_count), {});
  out.rank_load.assign(static_cast<size_t>(m), 0.0);
  for (int slot = 0; slot < s; ++slot) {
    const PhysicalSlot& p = out.slots[static_cast<size_t>(slot)];
    out.replicas[static_cast<size_t>(p.expert)].push_back(slot);
    out.rank_load[static_cast<size_t>(p.rank)] += p.load;
  }
  out.imbalance = load_imbalance(out.rank_load);

  if (e_count % m == 0) {
    std::vector<double> before(static_cast<size_t>(m), 0.0);
    for (int e = 0; e < e_count; ++e)
      before[static_cast<size_t>(e / (e_count / m))] += in.loads[static_cast<size_t>(e)];
    out.contiguous_imbalance = load_imbalance(before);
    out.contiguous_rank_load = std::move(before);
  } else {
    out.contiguous_note = fmt::format(
        "E={} experts do not divide over M={} ranks: no contiguous placement without replicas to compare",
        e_count, m);
  }
  return out;
}

}  // namespace expar
