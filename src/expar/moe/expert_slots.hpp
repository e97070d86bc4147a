#pragma once
// Expert weights and gradients between logical experts and physical slots (topo/placement.hpp, issue #36
// item 1). A rank's expert tensors are [S_L, ...], one entry per local slot; a replica's weights are its
// logical expert's. These helpers build a rank's slot tensors from logical ones [E, ...] (tests, loaders that
// hold every expert) and sum slot gradients back per logical expert (what training replicas rely on: the
// gradient of a replicated expert is the sum of its replicas').
#include <span>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

// [E, ...] (any dtype) -> [S_L, ...]: entry l is logical[global_expert(ep_rank, l)] (copied).
Tensor slot_rows(const ExpertPlacement& placement, int ep_rank, const Tensor& logical,
                 MemCategory category = MemCategory::ExpertWeights);

// ep_rank's slot weights from the weights of all E logical experts (matrices and biases as held; MXFP4
// experts are refused: their blocks are stacked by the loader).
ExpertWeights slot_expert_weights(const ExpertPlacement& placement, int ep_rank, const ExpertWeights& logical,
                                  MemCategory category = MemCategory::ExpertWeights);

// Every rank's f32 slot tensors [S_L, ...] (index = EP rank) -> [E, ...]: each logical expert's entry is the
// sum of its replicas' in ascending slot order (one replica: a copy, the same bits).
Tensor sum_replicas(const ExpertPlacement& placement, std::span<const Tensor> rank_slots);

// sum_replicas of every gradient tensor (w1, w3, w2 and the biases that are defined).
ExpertWeights sum_replica_grads(const ExpertPlacement& placement, std::span<const ExpertWeights> rank_grads);

// Per local slot of `ep_rank`: whether it is its logical expert's first (lowest) slot. Where a replicated
// expert must count once (the gradient norm, a checkpoint's experts), only its first slot does.
std::vector<bool> first_replica_slots(const ExpertPlacement& placement, int ep_rank);

// The logical experts whose first slot is on `ep_rank`, in local slot order: every expert on exactly one
// rank of the group.
std::vector<int> first_replica_experts(const ExpertPlacement& placement, int ep_rank);

}  // namespace expar
