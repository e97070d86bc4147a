#include "expar/moe/route_map.hpp"

#include <algorithm>
#include <limits>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

double RouteMap::drop_rate_of(int source) const {
  const int64_t t = tokens_per_source[static_cast<size_t>(source)];
  if (t == 0) return 0.0;
  int64_t req = 0, acc = 0;
  for (int e = 0; e < num_slots; ++e) {
    req += requested_of(source, e);
    acc += accepted_of(source, e);
  }
  return static_cast<double>(req - acc) / static_cast<double>(t * top_k);
}

double RouteMap::group_drop_rate() const {
  double sum = 0.0;
  for (int s = 0; s < ep_size; ++s) sum += drop_rate_of(s);
  return sum / ep_size;
}

int64_t RouteMap::rows_received_by(int destination) const {
  int64_t rows = 0;
  for (int e = 0; e < num_slots; ++e)
    if (slot_owner[static_cast<size_t>(e)] == destination)
      for (int s = 0; s < ep_size; ++s) rows += accepted_of(s, e);
  return rows;
}

double RouteMap::utilisation_of(int destination) const {
  if (capacity_rows == 0) return 0.0;
  return static_cast<double>(rows_received_by(destination)) / static_cast<double>(capacity_rows);
}

double RouteMap::max_utilisation() const {
  double best = 0.0;
  for (int p = 0; p < partitions; ++p) best = std::max(best, utilisation_of(p));
  return best;
}

std::vector<int64_t> count_requests(const Tensor& topk_idx, int num_experts) {
  EXPAR_CHECK(topk_idx.dtype() == DType::I32 && topk_idx.ndim() == 2,
              "topk_idx must be an int32 [T, K] tensor, got {} {}", dtype_name(topk_idx.dtype()),
              shape_string(topk_idx.shape()));
  const int64_t t_count = topk_idx.dim(0);
  const int k_count = static_cast<int>(topk_idx.dim(1));
  const int32_t* idx = topk_idx.data<int32_t>();
  std::vector<int64_t> counts(static_cast<size_t>(num_experts), 0);
  for (int64_t t = 0; t < t_count; ++t) {
    for (int k = 0; k < k_count; ++k) {
      const int32_t e = idx[t * k_count + k];
      if (e == -1) continue;
      EXPAR_CHECK(e >= 0 && e < num_experts,
                  "token {} route {} names expert {}: expert indices must be in [0, {}) "
                  "or -1 for an invalid route",
                  t, k, e, num_experts);
      for (int j = 0; j < k; ++j)
        EXPAR_CHECK(idx[t * k_count + j] != e,
                    "token {} names expert {} in routes {} and {}: a token's K experts must be distinct", t,
                    e, j, k);
      ++counts[static_cast<size_t>(e)];
    }
  }
  return counts;
}

namespace {

// The builder's inputs agree with each other; returns this rank's partition (-1 resolved to ep_rank).
int check_builder_inputs(const Tensor& topk_idx, int ep_rank, std::span<const int64_t> requests,
                         std::span<const int64_t> tokens, const ExpertPlacement& placement, int partition) {
  const auto m = static_cast<int>(tokens.size());
  const int p_count = placement.ep_size();
  const int e_count = placement.num_experts();
  EXPAR_CHECK(ep_rank >= 0 && ep_rank < m, "EP rank {} is outside the group of {}", ep_rank, m);
  if (partition < 0) {
    EXPAR_CHECK(m == p_count,
                "route map: {} source ranks but the expert placement is for {} ranks: the sources are the "
                "EP group unless a partition is given",
                m, p_count);
    partition = ep_rank;
  }
  EXPAR_CHECK(partition < p_count, "route map: partition {} is outside the placement's {} partitions",
              partition, p_count);
  const std::vector<int64_t> mine = count_requests(topk_idx, e_count);
  EXPAR_CHECK(tokens[static_cast<size_t>(ep_rank)] == topk_idx.dim(0),
              "route map: rank {} has {} tokens but the gathered token counts say {}", ep_rank,
              topk_idx.dim(0), tokens[static_cast<size_t>(ep_rank)]);
  EXPAR_CHECK(requests.size() == static_cast<size_t>(m) * e_count,
              "route map: request matrix has {} entries, expected {} x {}", requests.size(), m, e_count);
  for (int e = 0; e < e_count; ++e)
    EXPAR_CHECK(requests[static_cast<size_t>(ep_rank) * e_count + e] == mine[static_cast<size_t>(e)],
                "route map: rank {} routes {} tokens to expert {} but the gathered request matrix says {}",
                ep_rank, mine[static_cast<size_t>(e)], e,
                requests[static_cast<size_t>(ep_rank) * e_count + e]);
  return partition;
}

// Contract 3's row arithmetic from the accepted matrix: returns base[slot], the row where this source's first
// route to the slot lands on its partition, and sets this partition's expert_offsets and recv_rows.
std::vector<int64_t> row_bases(RouteMap& map, const ExpertPlacement& placement) {
  std::vector<int64_t> base(static_cast<size_t>(map.num_slots), 0);
  for (int r = 0; r < map.partitions; ++r) {
    int64_t offset = 0;
    for (int l = 0; l < placement.local_count(); ++l) {
      const int slot = placement.slot(r, l);
      int64_t before_me = 0;
      for (int s = 0; s < map.ep_rank; ++s) before_me += map.accepted_of(s, slot);
      base[static_cast<size_t>(slot)] = offset + before_me;
      int64_t all = 0;
      for (int s = 0; s < map.ep_size; ++s) all += map.accepted_of(s, slot);
      if (r == map.partition) map.expert_offsets.push_back(offset);
      offset += all;
    }
    if (r == map.partition) {
      map.expert_offsets.push_back(offset);
      map.recv_rows = offset;
    }
  }
  return base;
}

// Requests to logical expert e from the sources before `source`: where its routes start in e's deal, after
// the deal's start.
int64_t requests_before(std::span<const int64_t> requests, int e_count, int source, int e) {
  int64_t before = 0;
  for (int s = 0; s < source; ++s) before += requests[static_cast<size_t>(s) * e_count + e];
  return before;
}

// start_e of the replica deal: replica_starts[e], or 0 when the caller keeps no deal.
int64_t deal_start(std::span<const int64_t> replica_starts, int e) {
  return replica_starts.empty() ? 0 : replica_starts[static_cast<size_t>(e)];
}

void check_replica_starts(std::span<const int64_t> replica_starts, const ExpertPlacement& placement) {
  if (replica_starts.empty()) return;
  const int e_count = placement.num_experts();
  EXPAR_CHECK(replica_starts.size() == static_cast<size_t>(e_count),
              "route map: {} replica deal starts for {} experts: pass one per logical expert, or none",
              replica_starts.size(), e_count);
  for (int e = 0; e < e_count; ++e) {
    const int64_t start = replica_starts[static_cast<size_t>(e)];
    EXPAR_CHECK(start >= 0 && start < placement.replica_count(e),
                "route map: the replica deal of expert {} starts at replica {}, but it has {} replica(s): a "
                "start must be in [0, {}); reset the deal when the placement changes",
                e, start, placement.replica_count(e), placement.replica_count(e));
  }
}

// dst_rank / dst_row of each route in (token, k) order: the replica rule picks each route's slot, then the
// first accepted_of(me, slot) routes to a slot are accepted, the rest dropped; counts the sends, drops and
// invalid routes.
void assign_routes(RouteMap& map, const Tensor& topk_idx, const std::vector<int64_t>& base,
                   std::span<const int64_t> requests, const ExpertPlacement& placement,
                   std::span<const int64_t> replica_starts) {
  map.dst_rank = Tensor::empty({map.tokens, map.top_k}, DType::I32);
  map.dst_row = Tensor::empty({map.tokens, map.top_k}, DType::I32);
  int32_t* dst_rank = map.dst_rank.data<int32_t>();
  int32_t* dst_row = map.dst_row.data<int32_t>();
  const int32_t* idx = topk_idx.data<int32_t>();
  // next[e]: the position in e's deal of this rank's next route to e.
  std::vector<int64_t> next(static_cast<size_t>(map.num_experts), 0);
  if (placement.has_replicas())
    for (int e = 0; e < map.num_experts; ++e)
      next[static_cast<size_t>(e)] =
          deal_start(replica_starts, e) + requests_before(requests, map.num_experts, map.ep_rank, e);
  std::vector<int64_t> used(static_cast<size_t>(map.num_slots), 0);
  for (int64_t i = 0; i < map.tokens * map.top_k; ++i) {
    const int32_t e = idx[i];
    if (e < 0) {
      dst_rank[i] = dst_row[i] = -1;
      ++map.invalid;
      continue;
    }
    const std::vector<int>& replicas = placement.expert_slots(e);
    int64_t& j = next[static_cast<size_t>(e)];
    const int slot = replicas[static_cast<size_t>(j % static_cast<int64_t>(replicas.size()))];
    ++j;
    int64_t& n = used[static_cast<size_t>(slot)];
    if (n < map.accepted_of(map.ep_rank, slot)) {
      const int owner = map.slot_owner[static_cast<size_t>(slot)];
      dst_rank[i] = owner;
      dst_row[i] = static_cast<int32_t>(base[static_cast<size_t>(slot)] + n);
      ++map.send_counts[static_cast<size_t>(owner)];
      ++n;
    } else {
      dst_rank[i] = dst_row[i] = -1;
      ++map.dropped;
    }
  }
}

}  // namespace

std::vector<int64_t> slot_requests(std::span<const int64_t> requests, int sources,
                                   const ExpertPlacement& placement,
                                   std::span<const int64_t> replica_starts) {
  const int e_count = placement.num_experts(), s_count = placement.num_slots();
  EXPAR_ASSERT(requests.size() == static_cast<size_t>(sources) * e_count,
               "slot requests: request matrix has {} entries, expected {} x {}", requests.size(), sources,
               e_count);
  check_replica_starts(replica_starts, placement);
  // Slot id = expert id, unless an explicit table (EPLB's, R = 0 included) permutes them.
  if (!placement.has_replicas() && !placement.explicit_slots()) return {requests.begin(), requests.end()};
  std::vector<int64_t> out(static_cast<size_t>(sources) * s_count, 0);
  for (int e = 0; e < e_count; ++e) {
    const std::vector<int>& replicas = placement.expert_slots(e);
    const auto n = static_cast<int64_t>(replicas.size());
    int64_t before = deal_start(replica_starts, e);
    for (int r = 0; r < sources; ++r) {
      const int64_t c = requests[static_cast<size_t>(r) * e_count + e];
      // Routes j = 0..c-1 go to replica (before + j) mod n (before counting the deal's start): c / n each,
      // one more for the c % n from `first` on.
      const int64_t first = before % n;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t extra = ((i - first + n) % n) < c % n ? 1 : 0;
        out[static_cast<size_t>(r) * s_count + replicas[static_cast<size_t>(i)]] = c / n + extra;
      }
      before += c;
    }
  }
  return out;
}

RouteMap build_route_map(const Tensor& topk_idx, int ep_rank, std::span<const int64_t> requests,
                         std::span<const int64_t> tokens, const ExpertPlacement& placement,
                         const CapacityPolicy& policy, int partition,
                         std::span<const int64_t> replica_starts) {
  partition = check_builder_inputs(topk_idx, ep_rank, requests, tokens, placement, partition);
  RouteMap map;
  map.tokens = topk_idx.dim(0);
  map.top_k = static_cast<int>(topk_idx.dim(1));
  map.num_experts = placement.num_experts();
  map.num_slots = placement.num_slots();
  map.ep_size = static_cast<int>(tokens.size());
  map.ep_rank = ep_rank;
  map.partitions = placement.ep_size();
  map.partition = partition;
  map.tokens_per_source.assign(tokens.begin(), tokens.end());
  map.requested = slot_requests(requests, map.ep_size, placement, replica_starts);
  CapacityPlan plan = plan_capacity(map.requested, tokens, map.top_k, placement, policy);
  map.accepted = std::move(plan.accepted);
  map.capacity_rows = plan.capacity_rows;
  EXPAR_CHECK(
      map.capacity_rows <= std::numeric_limits<int32_t>::max(),
      "expert-side capacity of {} rows exceeds the int32 row index of the route map: use fewer tokens "
      "per rank or a capacity factor",
      map.capacity_rows);
  map.slot_owner.resize(static_cast<size_t>(map.num_slots));
  for (int s = 0; s < map.num_slots; ++s) map.slot_owner[static_cast<size_t>(s)] = placement.slot_rank(s);
  const std::vector<int64_t> base = row_bases(map, placement);
  map.recv_counts.assign(static_cast<size_t>(map.ep_size), 0);
  map.send_counts.assign(static_cast<size_t>(map.partitions), 0);
  for (int s = 0; s < map.ep_size; ++s)
    for (int slot : placement.local_slots(partition))
      map.recv_counts[static_cast<size_t>(s)] += map.accepted_of(s, slot);
  assign_routes(map, topk_idx, base, requests, placement, replica_starts);
  return map;
}

RouteMap build_route_map(const Tensor& topk_idx, Comm& source_group, const ExpertPlacement& placement,
                         const CapacityPolicy& policy, int partition,
                         std::span<const int64_t> replica_starts) {
  const int m = source_group.size();
  const int e_count = placement.num_experts();
  EXPAR_CHECK(partition >= 0 || m == placement.ep_size(),
              "route map: EP group '{}' has {} ranks but the expert placement is for {}", source_group.name(),
              m, placement.ep_size());
  std::vector<int64_t> mine = count_requests(topk_idx, e_count);
  mine.push_back(topk_idx.dim(0));
  std::vector<int64_t> gathered(static_cast<size_t>(m) * (e_count + 1));
  source_group.all_gather(mine.data(), gathered.data(), mine.size(), DType::I64);
  std::vector<int64_t> requests, tokens;
  requests.reserve(static_cast<size_t>(m) * e_count);
  for (int s = 0; s < m; ++s) {
    auto row = gathered.begin() + static_cast<ptrdiff_t>(s) * (e_count + 1);
    requests.insert(requests.end(), row, row + e_count);
    tokens.push_back(row[e_count]);
  }
  return build_route_map(topk_idx, source_group.rank(), requests, tokens, placement, policy, partition,
                         replica_starts);
}

}  // namespace expar
