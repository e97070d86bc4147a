#pragma once
// Training with redundant experts (issue #36 item 4): S = E + R expert slots over the M_E ranks of each
// EP_MP group, a replicated expert in several slots that stays one expert.
//  - Initial placement: DeepSeek's EPLB (topo/expert_balance.hpp) on a uniform load, which replicates the
//    first R experts (R <= E; beyond that it goes round again) and packs the slots rank by rank, replicas of
//    one expert on distinct ranks where there is room. The same table on every rank, from E, R, M_E alone.
//  - Replicas stay one expert: each slot's gradient covers only the routes dealt to it, so before the clip
//    and the optimizer every replica's gradient becomes the sum over the expert's slots in ascending slot
//    order (gathered over EP_MP), the same bits on every holder; with the same weights and Adam moments,
//    every holder then applies the same update. The gradient norm counts each expert's first slot only
//    (Parameter::norm_rows, set by the model).
#include <span>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/parameter.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

// Before the layout is made: throws expar::Error naming --redundant-experts and the values accepted (and the
// --ep values that the `world` ranks with context-parallel degree `cp` accept) when R < 0 or M_E = `ep`
// does not divide num_experts + R. A layout refused for another reason is left to its own refusal.
void check_redundant_experts(int num_experts, int redundant, int ep, int world, int cp);

// The slot table of a run with `redundant` extra slots over `ep_size` ranks (MoeExecution::slots): empty
// when redundant is 0 (one slot per expert, the placement's own layout).
std::vector<int> training_expert_slots(int num_experts, int redundant, int ep_size);

// Every replicated expert's gradient summed over its replicas, into each of them (collective over ep_mp,
// the EP_MP group `placement` spans; nothing without replicas). `params`' expert tensors are [S_L, ...].
void sum_replica_gradients(std::span<Parameter* const> params, const ExpertPlacement& placement, Comm& ep_mp);

}  // namespace expar
