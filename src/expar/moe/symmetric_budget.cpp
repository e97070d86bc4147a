#include "expar/moe/symmetric_budget.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar {

RowwiseBudget rowwise_budget(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                             const CapacityPolicy& policy, int64_t d, const PayloadPrecision& precision,
                             int moe_blocks, int recomputed_blocks) {
  EXPAR_ASSERT(moe_blocks >= 0 && recomputed_blocks >= 0 && recomputed_blocks <= moe_blocks,
               "rowwise budget: {} recomputed of {} MoE blocks", recomputed_blocks, moe_blocks);
  RowwiseBudget b;
  b.capacity_rows = max_capacity_rows(max_tokens_per_rank, top_k, placement, policy);
  b.slot_bytes = rowwise_slot_bytes(b.capacity_rows, d, precision);
  if (moe_blocks == 0) return b;
  b.leased_slots = (moe_blocks - recomputed_blocks) + 1;
  b.scratch_slots = recomputed_blocks > 0 ? 2 : 1;
  return b;
}

}  // namespace expar
