#pragma once
// `expar plan` with the symmetric buffers the trainer allocates: topo/plan's make_plan (weights, gradients,
// optimizer state, traffic) plus, per pipeline stage, the rowwise lease pool that MoeTransformer makes and
// the trainer's dry-run step fills for one microbatch in flight (moe/symmetric_budget.hpp: slots of the
// capacity policy's max_capacity_rows x rowwise_slot_bytes, the same functions the pool is made with).
// tests/train/plan_buffers_test.cpp holds the figures to what train() allocates for M_E = 1, 2, 4.
#include "expar/moe/payload_precision.hpp"
#include "expar/topo/plan.hpp"

namespace expar {

struct PlanBufferOptions {
  PayloadPrecision precision;  // of the four row movements (the trainer's default: f32)
  bool recompute_moe = false;  // every MoE block recomputed (expar train --recompute-moe)
};

// Throws expar::Error like make_plan, and for an unknown capacity policy (naming the rules).
Plan plan_training(const PlanConfig& config, const PlanBufferOptions& buffers);

}  // namespace expar
