#pragma once
// `expar plan` with the symmetric buffers the trainer allocates and the activations its forward saves:
// topo/plan's make_plan (weights, gradients, optimizer state, traffic) plus, per pipeline stage, the rowwise
// lease pool that MoeTransformer makes and the trainer's dry-run step fills for one microbatch in flight
// (moe/symmetric_budget.hpp: slots of the capacity policy's max_capacity_rows x rowwise_slot_bytes, the same
// functions the pool is made with). With path "aggregated" each stage also holds one pack buffer per MoE
// layer (moe/symmetric_budget.hpp's PackBudget: exact when the EP group fits in one node, the most it can
// reach across nodes). tests/train/lease_lifecycle_test.cpp holds the figures to what train() allocates. Each
// stage's saved activations, one microbatch in flight, are train/plan_activations.hpp's (tests/train/
// plan_activations_test.cpp holds them to what a training forward holds).
#include "expar/moe/payload_precision.hpp"
#include "expar/topo/message_model.hpp"
#include "expar/topo/plan.hpp"

namespace expar {

struct PlanBufferOptions {
  PayloadPrecision precision;    // of the four row movements (the trainer's default: f32)
  bool recompute_moe = false;    // every MoE block recomputed (expar train --recompute-moe)
  std::string path = "rowwise";  // rowwise | aggregated (the paths that take the shared lease pool)
  int ranks_per_node = MessageModelInputs{}.ranks_per_node;  // the nodes an aggregated EP group spans
  // The saved activations (train/plan_activations.hpp): tokens of one whole sequence (0: T * C, one
  // sequence per rank), and BF16 products (expar train --precision bf16) or f32.
  int64_t seq_len = 0;
  bool bf16_products = true;
};

// Throws expar::Error like make_plan, for an unknown capacity policy (naming the rules), for another path,
// and for an aggregated EP group that neither fits in one node nor fills whole nodes.
Plan plan_training(const PlanConfig& config, const PlanBufferOptions& buffers);

}  // namespace expar
