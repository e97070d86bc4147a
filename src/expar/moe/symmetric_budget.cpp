#include "expar/moe/symmetric_budget.hpp"

#include <algorithm>
#include <bit>

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

size_t aggregated_pack_bytes(int64_t rows, int64_t d, const PayloadPrecision& precision) {
  return std::bit_ceil(static_cast<size_t>(std::max<int64_t>(rows, 1)) * precision.max_row_bytes(d));
}

PackBudget aggregated_pack_budget(int64_t max_tokens_per_rank, int top_k, const ExpertPlacement& placement,
                                  const CapacityPolicy& policy, int ranks_per_node, int64_t d,
                                  const PayloadPrecision& precision) {
  const int m = placement.ep_size();
  EXPAR_CHECK(
      ranks_per_node >= 1 && (m % ranks_per_node == 0 || ranks_per_node % m == 0),
      "--ranks-per-node {} with --ep {}: the aggregated path's pack buffers are planned for an EP group "
      "that fits in one node or fills whole nodes (pass --ranks-per-node a divisor or a multiple of "
      "--ep)",
      ranks_per_node, m);
  const int on_node = std::min(m, ranks_per_node);
  PackBudget b;
  b.nodes = m / on_node;
  const size_t one_row = aggregated_pack_bytes(0, d, precision);
  if (b.nodes == 1) {
    b.block_bytes = static_cast<int64_t>(one_row);
    return b;
  }
  const int64_t experts_on_node = static_cast<int64_t>(on_node) * placement.local_count();
  const int64_t others = b.nodes - 1, t = max_tokens_per_rank;
  b.bound_rows = others * t * std::min<int64_t>(top_k, experts_on_node);
  const double cf_rows = policy.capacity_factor * static_cast<double>(t) * top_k;
  switch (policy.rule) {
    case CapacityRule::Dropless:
      break;
    case CapacityRule::Source:
      b.bound_rows = std::min(b.bound_rows, others * on_node * ceil_rows(cf_rows / m));
      break;
    case CapacityRule::Expert:
      b.bound_rows =
          std::min(b.bound_rows, others * experts_on_node * ceil_rows(cf_rows / placement.num_slots()));
      break;
    case CapacityRule::Rank:
      b.bound_rows = std::min(b.bound_rows, on_node * std::max<int64_t>(1, ceil_rows(cf_rows)));
      break;
  }
  // Every generation, one row's buffer up to the bound's, doubling: 2*largest - smallest.
  const size_t largest = aggregated_pack_bytes(b.bound_rows, d, precision);
  b.block_bytes = static_cast<int64_t>(2 * largest - one_row);
  return b;
}

}  // namespace expar
