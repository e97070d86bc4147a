#pragma once
// RouteMap: THE single truth of where each route's row lands (seed 000 §5.4; contracts 2 and 3 of
// docs/design.md).
//
// For every route (t, k) of this source rank: dst_rank[t,k] (EP rank of its expert) and dst_row[t,k] (row of
// that rank's expert-side buffer), both -1 for a dropped or invalid route. The expert-side layout is
// expert-major (local expert order), then source rank, then source token, then k, packed from row 0:
//   row = offset of the expert on its rank + accepted routes for that expert from earlier source ranks
//         + earlier accepted routes of this rank for that expert in (token, k) order.
// Everything else here follows from the accepted matrix, which every rank of the EP group knows identically
// (one all-gather of the [ranks x E] request counts and each source's token count; no per-row host lists).
//
// Slots (issue #36 item 1). The router picks LOGICAL experts; the placement holds them in S >= E physical
// slots (topo/placement.hpp), an expert with several slots having replicas. The map works on slots: every
// "expert" of the layout above, of requested / accepted and of the expert-side buffers is a slot (in the
// contiguous and round-robin placements slot id = expert id, so nothing changes). Replica rule: the routes of
// the whole group to a logical expert e with n_e replicas, taken in (source rank, token, k) order, are dealt
// in turn over its slots expert_slots(e), continuing where the previous map's deal stopped: the j-th route of
// source r to e goes to replica (start_e + before_r(e) + j) mod n_e, where before_r(e) = requests to e from
// sources < r and start_e is the deal's position (replica_deal.hpp; 0 when the caller keeps none). Each rank
// computes it from the gathered request matrix it already has, and the routes to e split within 1 over its
// replicas, in one map and over a run of maps (a rule by source rank alone, e.g. (j + r) mod n_e, balances
// each source but can pile the remainders of several sources on one replica; a deal restarting at replica 0
// in every map sends batch-1 decode's single route per expert to its first replica every step). The capacity
// policy then runs on the slot request matrix (capacity.hpp: a slot is its "expert").
//
// Sources and destinations. The M ranks that contribute tokens are the sources (ep_size, ep_rank); the P
// expert partitions of the placement are the destinations (partitions, partition; dst_rank holds a
// partition). In the MoE layer both are the EP group (P = M, partition = ep_rank). Inference's agrs path
// (seed 002) gathers tokens over a TP (or the whole) group of M ranks while variable EP places experts on
// P < M partitions, each held by M/P ranks with intermediate-dimension shards: every rank of a partition
// receives the partition's rows. Only the agrs path takes maps with P != M; block and rowwise refuse them.
#include <cstdint>
#include <span>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class Comm;

struct RouteMap {
  int64_t tokens = 0;   // T of this source rank
  int top_k = 0;        // K
  int num_experts = 0;  // E: logical experts (what topk_idx names)
  int num_slots = 0;    // S: physical slots (the axis of requested / accepted; S = E without replicas)
  int ep_size = 1;      // M: source ranks
  int ep_rank = 0;      // this rank as a source
  int partitions = 1;   // P: destinations (expert partitions of the placement)
  int partition = 0;    // this rank as a destination

  Tensor dst_rank;  // [T, K] int32, -1 = dropped or invalid
  Tensor dst_row;   // [T, K] int32, -1 = dropped or invalid

  // Identical on every rank of the EP group.
  std::vector<int64_t> tokens_per_source;  // [M]
  std::vector<int64_t> requested;          // [M x S], source-major: routes per slot (after the replica rule)
  std::vector<int64_t> accepted;           // [M x S], source-major
  std::vector<int> slot_owner;             // [S]: partition that holds each slot (from the placement)
  int64_t capacity_rows = 0;               // rows of every partition's expert-side buffer

  // This rank as the expert rank (of its partition).
  std::vector<int64_t> expert_offsets;  // [E_L + 1]: local slot l owns rows [offsets[l], offsets[l+1])
  int64_t recv_rows = 0;             // = expert_offsets[E_L]; rows [recv_rows, capacity_rows) stay unwritten
  std::vector<int64_t> recv_counts;  // [M] rows received from each source rank (block path)
  // This rank as the source.
  std::vector<int64_t> send_counts;  // [P] accepted rows sent to each destination (block path)
  int64_t dropped = 0;               // routes of this rank dropped by the capacity policy
  int64_t invalid = 0;               // routes of this rank with expert index -1 on input (never requested)

  int32_t rank_of(int64_t t, int k) const { return dst_rank.data<int32_t>()[t * top_k + k]; }
  int32_t row_of(int64_t t, int k) const { return dst_row.data<int32_t>()[t * top_k + k]; }
  bool valid(int64_t t, int k) const { return row_of(t, k) >= 0; }
  int64_t accepted_of(int source, int slot) const {
    return accepted[static_cast<size_t>(source) * num_slots + static_cast<size_t>(slot)];
  }
  int64_t requested_of(int source, int slot) const {
    return requested[static_cast<size_t>(source) * num_slots + static_cast<size_t>(slot)];
  }
  // Drop rate of source s: dropped / (T_s·K) (0 for a rank without tokens).
  double drop_rate_of(int source) const;
  // Mean over the ranks of the group of their drop rates.
  double group_drop_rate() const;
  // Rows received by partition p / capacity_rows (0 when the capacity is 0).
  double utilisation_of(int partition) const;
  // Max over the partitions of their utilisation.
  double max_utilisation() const;
  int64_t rows_received_by(int partition) const;
  // Sources and destinations are the same ranks (every path but agrs needs this).
  bool sources_are_partitions() const { return partitions == ep_size && partition == ep_rank; }
};

// Routes to each expert from this rank: [E]. topk_idx is [T, K] int32; -1 entries are invalid routes
// (skipped). Throws for an index out of range or a token that names the same expert twice.
std::vector<int64_t> count_requests(const Tensor& topk_idx, int num_experts);

// The replica rule on counts: the group's logical request matrix [M x E] -> the slot request matrix
// [M x S] (source r's requests to expert e dealt over e's slots from replica (start_e + before_r(e)) mod n_e
// on). `replica_starts`: start_e per logical expert, each in [0, n_e) (ReplicaDeal::starts()); empty: all 0.
// Without replicas it is the same matrix.
std::vector<int64_t> slot_requests(std::span<const int64_t> requests, int sources,
                                   const ExpertPlacement& placement,
                                   std::span<const int64_t> replica_starts = {});

// The pure builder: this rank's map from its own topk_idx and the group's gathered requests [M x E] and
// token counts [M] (M = tokens.size() sources; this rank is source `ep_rank`). Every rank calling it with
// its own topk_idx gets a consistent set of maps. `requests` counts LOGICAL experts (count_requests); the
// map's matrices are per slot (slot_requests). `partition` is this rank's destination among the placement's P
// partitions; -1 means the sources are the partitions (M = P, partition = ep_rank). P != M needs the dropless
// policy. `replica_starts`: where each expert's replica deal starts (slot_requests); every rank of the group
// must pass the same.
RouteMap build_route_map(const Tensor& topk_idx, int ep_rank, std::span<const int64_t> requests,
                         std::span<const int64_t> tokens, const ExpertPlacement& placement,
                         const CapacityPolicy& policy, int partition = -1,
                         std::span<const int64_t> replica_starts = {});

// Collective over the source group (size M): one all_gather of [E + 1] int64 per rank (request counts and
// T), then the pure builder. With partition = -1 the group is the EP group (M = placement.ep_size()).
RouteMap build_route_map(const Tensor& topk_idx, Comm& source_group, const ExpertPlacement& placement,
                         const CapacityPolicy& policy, int partition = -1,
                         std::span<const int64_t> replica_starts = {});

}  // namespace expar
