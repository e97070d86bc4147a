#pragma once
// The symmetric memory a rank's rowwise MoE blocks hold during training (seed 000 §5.1, §5.7): the shared
// lease pool MoeTransformer makes, with slots of rowwise_slot_bytes(max_capacity_rows(...)) (the capacity
// policy's rows, dropless: the bound M_E*T*min(K, E_L)), and the slots the trainer's dry-run step leaves it
// with for one microbatch in flight: a dispatch lease per MoE block that keeps its payload for backward,
// one input-gradient lease, and the expert-output scratch slot; a recomputed block keeps no dispatch lease
// and uses the dispatch scratch slot instead. `expar plan` states these figures (train/plan_buffers.hpp);
// tests/train/plan_buffers_test.cpp holds them to what train() allocates.
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

}  // namespace expar
