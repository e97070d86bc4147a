#pragma once
// AdamW with f32 state and decoupled weight decay, gradient clipping by the global norm, and optional
// sharding of the routed-expert optimizer state over EP_DP.
//
// Global norm: every replica is counted once. Dense gradients are identical on all ranks after reduction,
// so their squared norm is taken locally; each EP_MP rank holds a different expert shard, so the expert
// squared norms are summed over EP_MP. Redundant expert slots hold their expert's summed gradient, so only
// the entries a parameter's norm_rows mark count. Sums are in f64 in a fixed order.
//
// Sharding (ZeRO-1 style, over EP_DP): member j of an EP_DP group of size D_E keeps Adam state for, and
// updates, only the j-th contiguous 1/D_E of each expert tensor, then the updated slices are all-gathered
// so every replica holds the whole shard again. Dense state is never sharded.
//
// BF16 copies (Parameter::bf16_copy, mixed-precision training): each updated value is rounded into its copy
// in the update's own pass, so the master weights are read once per step, not twice (a sharded parameter's
// copy is refreshed whole after the gather, which also brings the other members' slices).
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/parameter.hpp"

namespace expar {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double clip_norm = 1.0;  // <= 0 disables clipping
  bool shard_expert_state = false;
};

class AdamW {
 public:
  // ep_mp / ep_dp may be the same single-rank group when there is no EP.
  AdamW(std::vector<Parameter*> params, AdamWConfig config, Comm& ep_mp, Comm& ep_dp);

  // One update with learning rate `lr`. Returns the global gradient norm before clipping.
  double step(double lr);
  // Global gradient norm as defined above (collective over EP_MP).
  double global_grad_norm();

  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  // Adam moments per parameter (only this member's slice when sharded), for checkpoints.
  struct State {
    Tensor m, v;
    int64_t begin = 0, end = 0;  // element range of the parameter this state covers
  };
  std::vector<State>& state() { return state_; }
  const std::vector<Parameter*>& params() const { return params_; }

 private:
  std::vector<Parameter*> params_;
  AdamWConfig config_;
  Comm& ep_mp_;
  Comm& ep_dp_;
  std::vector<State> state_;
  int64_t steps_ = 0;
};

}  // namespace expar
