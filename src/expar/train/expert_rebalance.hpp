#pragma once
// Re-placing the experts while training (`expar train --eplb-interval N`, issue #36 item 4): every N steps
// the trainer sums the routes per expert over the window (every rank, every MoE block), asks DeepSeek's
// EPLB policy (topo/expert_balance.hpp) for a placement of the same E experts in the same S slots, and, when
// it differs, moves to it between steps. One placement serves every MoE block (the blocks share one slot
// table), from the loads summed over the blocks.
//
// The move keeps the model: a rank's new slot takes its expert's master weights and Adam moments from the
// rank's own old slot of that expert when it had one, else from the expert's first old slot, whose rank
// sends them (one all-to-all over EP_MP carrying only the slots that change rank). Replicas hold the same
// values, so every copy is the expert's; the logical model and its optimizer state are unchanged, and the
// loss curve moves only by the reduction order of the new routes.
#include <cstdint>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/topo/placement.hpp"
#include "expar/train/adamw.hpp"

namespace expar {

struct ExpertMove {
  int slots_changed = 0;   // slots of the group whose expert differs (0: EPLB kept the placement)
  int64_t bytes_sent = 0;  // weights and moments sent (move_experts: this rank's; rebalance: the group's)
  double imbalance_before = 0;  // (max - mean) / mean of the ranks' loads under the old placement
  double imbalance_after = 0;   // and under the new one
  double seconds = 0;           // rebalance: the whole re-placement, counts included
};

// `--eplb-interval N`: the routes of a window of N steps, and the re-placement at its end.
class ExpertRebalancer {
 public:
  explicit ExpertRebalancer(int interval) : interval_(interval) {}
  // Adds this rank's routes of a step ([layers x E], before any sum over the ranks); nothing when off.
  void count(const std::vector<int64_t>& routes);
  // Whether a window ends after step `step` (0-based) of a run whose steps end before `last`.
  bool window_ends(int step, int last) const {
    return interval_ > 0 && (step + 1) % interval_ == 0 && step + 1 < last;
  }
  // The window's routes summed over every rank of `world` and every MoE block give EPLB's placement,
  // which the model moves to when it differs (move_experts over ep_mp); the window starts again.
  ExpertMove rebalance(MoeTransformer& model, AdamW& optimizer, Comm& ep_mp, Comm& world);

 private:
  int interval_;
  std::vector<int64_t> window_;
};

// The placement of `current`'s experts and slots that EPLB chooses for `loads` (per logical expert).
ExpertPlacement balanced_placement(const ExpertPlacement& current, const std::vector<double>& loads);

// (max - mean) / mean of the ranks' loads under `placement`, a replica carrying L_e / replicas of e.
double placement_imbalance(const ExpertPlacement& placement, const std::vector<double>& loads);

// Moves the model's expert weights and `optimizer`'s moments to `next` and sets it on every MoE block
// (collective over ep_mp, between steps). The optimizer's expert state must be whole (not sharded over
// EP_DP). Returns slots_changed and bytes_sent.
ExpertMove move_experts(MoeTransformer& model, AdamW& optimizer, const ExpertPlacement& next, Comm& ep_mp);

}  // namespace expar
