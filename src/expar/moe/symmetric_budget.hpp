#pragma once
// The symmetric memory a rank's rowwise MoE blocks hold during training (seed 000 §5.1, §5.7): the shared
// lease pool MoeTransformer makes, with slots of rowwise_slot_bytes(max_capacity_rows(...)) (the capacity
// policy's rows, dropless: the bound M_E*T*min(K, E_L)), and the slots the trainer's dry-run step leaves it
// with for one microbatch in flight: a dispatch lease per MoE block that keeps its payload for backward,
// one input-gradient lease, and the expert-output scratch slot; a recomputed block keeps no dispatch lease
// and uses the dispatch scratch slot instead. `expar plan` states these figures (train/plan_buffers.hpp);
// The aggregated path takes its slots from the same pool and has one pack buffer per block beside it
// (PackBudget). tests/train/lease_lifecycle_test.cpp holds these figures to what train() allocates.
#include <cstdint>

#include "expar/moe/capacity.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

struct RowwiseBudget {
  int64_t capacity_rows = 0;  // rows of one slot
  size_t slot_bytes = 0;
  int leased_slots = 0;   // dispatch leases + the input-gradient lease
  int scratch_slots = 0;  // expert outputs (+ dispatch payloads under recomputation)
  int64_t resident_bytes() const {
    return static_cast<int64_t>(leased_slots + scratch_slots) * static_cast<int64_t>(slot_bytes);
  }
};

// max_tokens_per_rank: the largest forward any rank makes (T of a microbatch, or of the validation batch if
// larger). moe_blocks blocks, of which recomputed_blocks recompute their MoE MLP.
RowwiseBudget rowwise_budget(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                             const CapacityPolicy& policy, int64_t d, const PayloadPrecision& precision,
                             int moe_blocks, int recomputed_blocks);

// The aggregated path's pack buffers (moe/paths/aggregated.cpp), one per MoE block on the same heap as the
// pool: sized by the largest block of rows any proxy holds in a step (the routes decide it), grown by powers
// of two from one row and never freed (the heap frees nothing). An EP group inside one node packs nothing,
// so each block holds exactly one row's buffer; across nodes a proxy serves the members with its index on
// the other nodes, each sending it at most T*min(K, R_E*E_L) rows (a token's K experts are distinct), so it
// holds at most bound_rows = (nodes - 1)*T*min(K, R_E*E_L), or less under a capacity rule (moe/capacity.hpp):
// source, (nodes - 1)*R_E*ceil(cf*T*K/M_E) (B_s per destination rank); expert, (nodes - 1)*R_E*E_L*
// ceil(cf*T*K/E); rank, R_E*max(1, ceil(cf*T*K)) (every row it holds lands on one of its node's R_E ranks).
// A block then holds at most every power of two from one row's buffer up to that bound's.
struct PackBudget {
  int nodes = 1;            // of one EP group: M_E / min(M_E, ranks per node)
  int64_t bound_rows = 0;   // the most rows one proxy holds (0: one node)
  int64_t block_bytes = 0;  // resident pack bytes of one block: exact on one node, the most across nodes
  bool exact() const { return nodes == 1; }
};

// Bytes of one pack buffer for `rows` rows of the largest format of the four legs (at least one row),
// rounded up to a power of two: what the aggregated path allocates.
size_t aggregated_pack_bytes(int64_t rows, int64_t d, const PayloadPrecision& precision);

// Throws expar::Error when the EP group neither fits in one node nor fills whole nodes of ranks_per_node.
PackBudget aggregated_pack_budget(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                                  const CapacityPolicy& policy, int ranks_per_node, int64_t d,
                                  const PayloadPrecision& precision);

}  // namespace expar
