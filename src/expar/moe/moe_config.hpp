#pragma once
// An MoE block in two parts that change for different reasons:
//  - MoeConfig: what the block IS — its routing, its widths and its experts' form. A checkpoint's: our
//    manifest or a Hugging Face config.json says it, and a run cannot change it without other weights.
//  - MoeExecution: how a run EXECUTES it — the path, the capacity policy, the payload precisions, the
//    placement of experts on ranks and the wave schedule. Never saved: the same weights run under any of
//    them (bit-identical across paths, placements and schedules; a capacity policy may drop routes).
// MoeLayer is built from both; each validate() is the one place its rules are checked.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/moe/capacity.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/router.hpp"
#include "expar/moe/waves.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

struct MoeConfig {
  // E, K, the score function, renormalisation, group limits and the two loss coefficients.
  RouterConfig router;
  int64_t model_dim = 0;   // d
  int64_t hidden_dim = 0;  // h (per expert)
  // gpt-oss: a router bias [E] added to the logits (a trained parameter, MoeParams::router_bias), and
  // experts with gate/up/down biases and the clamped SwiGLU. Set from the family's features (its config.json
  // implies them; our manifest has none).
  bool router_bias = false;
  bool expert_biases = false;
  ExpertMlpActivation activation = ExpertMlpActivation::Swiglu;
  // Auxiliary-loss-free balancing: a score bias [E] that changes selection only (the trainer moves it:
  // --score-bias-rate). A tensor of every checkpoint that has it.
  bool use_score_bias = false;

  // Throws expar::Error naming the offending value and the fix.
  void validate() const;
};

struct MoeExecution {
  std::string path = "local";
  CapacityPolicy capacity;     // dropless by default
  PayloadPrecision precision;  // of the four row movements (block, rowwise, aggregated; others need f32)
  PlacementKind placement = PlacementKind::Contiguous;
  // Redundant experts (issue #36 item 1): an explicit slot table, slot s holding logical expert slots[s] on
  // EP rank s / (S/M) (topo/placement.hpp; e.g. the slots of topo/expert_balance.hpp). Empty: `placement`'s
  // layout with one slot per expert. Each rank's expert weights are its slots' (replicas identical).
  std::vector<int> slots;
  // The experts' schedule (moe/waves.hpp): waves of local experts, sequential or with the communication of
  // neighbouring waves overlapped on its own thread (paths whose traits say `waves`: block, rowwise).
  WaveConfig waves;

  // Checks the choices against the block they run on an EP group of ep_size ranks (E divisible by the EP
  // degree, waves within the local experts, payload formats against d); throws expar::Error naming the
  // value and the fix.
  void validate(const MoeConfig& block, int ep_size) const;
  // The placement these choices give `num_experts` experts on `ep_size` ranks: from `slots` when given, else
  // `placement`'s. Throws expar::Error naming the fix (topo/placement.hpp).
  ExpertPlacement expert_placement(int num_experts, int ep_size) const;
};

}  // namespace expar
