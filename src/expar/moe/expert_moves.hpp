#pragma once
// Moving expert weights between the ranks of an EP group when the placement of the slots changes (issue #36:
// `expar serve` rebalancing while running). Every rank holds its slots' weights [S_L, ...] as stored (f32,
// BF16, block-scaled FP8 with its scale grid, MXFP4 blocks and scales, biases); after the move it holds the
// slots of the new placement, each copied from a rank that held that expert: its own old slot when it had
// one, else over the group (no reload from disk). One all-to-all per tensor, in the group's rank order.
//
// Which rank sends a slot is a function of the two placements alone, so sender and receiver agree without
// talking: destination d's new local slot l holding expert e is copied locally when d held e, otherwise from
// e's old replica (d + l) mod replicas(e) (spreading the sends of a hot expert over its replicas).
#include <cstdint>

#include "expar/comm/comm.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

struct ExpertMoveStats {
  int64_t bytes_received = 0;  // weight bytes (scales included) this rank received from other ranks
  int slots_received = 0;      // its new slots that came from another rank
};

// Collective over `ep_group` (size = the placements' ep_size, rank = this rank's EP rank): the weights of
// this rank's slots under `to`, from `held` (its slots under `from`). The placements must have the same
// experts, ranks and slots per rank. Adds what it received to *stats when given.
ExpertWeights move_expert_slots(const ExpertPlacement& from, const ExpertPlacement& to,
                                const ExpertWeights& held, Comm& ep_group, ExpertMoveStats* stats = nullptr);

}  // namespace expar
