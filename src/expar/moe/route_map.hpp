#pragma once
// RouteMap: THE single truth of where each route's row lands (seed 000 §5.4, DESIGN contracts 2 and 3).
//
// For every route (t, k) of this source rank: dst_rank[t,k] (EP rank of its expert) and dst_row[t,k] (row of
// that rank's expert-side buffer), both -1 for a dropped or invalid route. The expert-side layout is
// expert-major (local expert order), then source rank, then source token, then k, packed from row 0:
//   row = offset of the expert on its rank + accepted routes for that expert from earlier source ranks
//         + earlier accepted routes of this rank for that expert in (token, k) order.
// Everything else here follows from the accepted matrix, which every rank of the EP group knows identically
// (one all-gather of the [ranks x E] request counts and each source's token count; no per-row host lists).
#include <cstdint>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class Comm;

struct RouteMap {
  int64_t tokens = 0;  // T of this source rank
  int top_k = 0;       // K
  int num_experts = 0;
  int ep_size = 1;
  int ep_rank = 0;

  Tensor dst_rank;  // [T, K] int32, -1 = dropped or invalid
  Tensor dst_row;   // [T, K] int32, -1 = dropped or invalid

  // Identical on every rank of the EP group.
  std::vector<int64_t> tokens_per_source;  // [M]
  std::vector<int64_t> requested;          // [M x E], source-major
  std::vector<int64_t> accepted;           // [M x E], source-major
  std::vector<int> expert_owner;           // [E]: EP rank that owns each expert (from the placement)
  int64_t capacity_rows = 0;               // rows of every rank's expert-side buffer

  // This rank as the expert rank.
  std::vector<int64_t> expert_offsets;  // [E_L + 1]: local expert l owns rows [offsets[l], offsets[l+1])
  int64_t recv_rows = 0;             // = expert_offsets[E_L]; rows [recv_rows, capacity_rows) stay unwritten
  std::vector<int64_t> recv_counts;  // [M] rows received from each source rank (block path)
  // This rank as the source.
  std::vector<int64_t> send_counts;  // [M] accepted rows sent to each destination rank (block path)
  int64_t dropped = 0;               // routes of this rank dropped by the capacity policy
  int64_t invalid = 0;               // routes of this rank with expert index -1 on input (never requested)

  int32_t rank_of(int64_t t, int k) const { return dst_rank.data<int32_t>()[t * top_k + k]; }
  int32_t row_of(int64_t t, int k) const { return dst_row.data<int32_t>()[t * top_k + k]; }
  bool valid(int64_t t, int k) const { return row_of(t, k) >= 0; }
  int64_t accepted_of(int source, int expert) const {
    return accepted[static_cast<size_t>(source) * num_experts + static_cast<size_t>(expert)];
  }
  int64_t requested_of(int source, int expert) const {
    return requested[static_cast<size_t>(source) * num_experts + static_cast<size_t>(expert)];
  }
  // Drop rate of source s: dropped / (T_s·K) (0 for a rank without tokens).
  double drop_rate_of(int source) const;
  // Mean over the ranks of the group of their drop rates.
  double group_drop_rate() const;
  // Rows received by rank r / capacity_rows (0 when the capacity is 0).
  double utilisation_of(int rank) const;
  // Max over the ranks of the group of their utilisation.
  double max_utilisation() const;
  int64_t rows_received_by(int rank) const;
};

// Routes to each expert from this rank: [E]. topk_idx is [T, K] int32; -1 entries are invalid routes
// (skipped). Throws for an index out of range or a token that names the same expert twice.
std::vector<int64_t> count_requests(const Tensor& topk_idx, int num_experts);

// The pure builder: this rank's map from its own topk_idx and the group's gathered requests [M x E] and
// token counts [M]. Every rank calling it with its own topk_idx gets a consistent set of maps.
RouteMap build_route_map(const Tensor& topk_idx, int ep_rank, std::span<const int64_t> requests,
                         std::span<const int64_t> tokens, const ExpertPlacement& placement,
                         const CapacityPolicy& policy);

// Collective over the EP group (size M = placement.ep_size()): one all_gather of [E + 1] int64 per rank
// (request counts and T), then the pure builder.
RouteMap build_route_map(const Tensor& topk_idx, Comm& ep_group, const ExpertPlacement& placement,
                         const CapacityPolicy& policy);

}  // namespace expar
