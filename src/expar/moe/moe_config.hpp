#pragma once
// What one MoE block is (experts, routing, widths, the families' options) and how a run executes it
// (capacity policy, path, payload precision, placement, wave schedule). MoeConfig::validate is the one place
// their rules are checked.
#include <cstdint>
#include <string>

#include "expar/moe/capacity.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/router.hpp"
#include "expar/moe/waves.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

struct MoeConfig {
  int num_experts = 0;     // E
  int top_k = 0;           // K
  int64_t model_dim = 0;   // d
  int64_t hidden_dim = 0;  // h (per expert)
  ScoreFunction score = ScoreFunction::Softmax;
  bool renormalize = false;
  bool softmax_over_topk = false;  // gpt-oss's router (RouterConfig)
  // gpt-oss: a router bias [E] added to the logits (a trained parameter, MoeParams::router_bias), and
  // experts with gate/up/down biases and the clamped SwiGLU. Set from the architecture's features; not part
  // of a checkpoint's model config (the family's config.json says it).
  bool router_bias = false;
  bool expert_biases = false;
  ExpertMlpActivation activation = ExpertMlpActivation::Swiglu;
  int n_group = 1;
  int topk_group = 1;
  bool use_score_bias = false;  // auxiliary-loss-free balancing (the trainer moves it: --score-bias-rate)
  CapacityPolicy capacity;      // dropless by default
  double aux_loss_coef = 0.0;
  double z_loss_coef = 0.0;
  std::string path = "local";
  PayloadPrecision precision;  // of the four row movements (block, rowwise, aggregated; others need f32)
  PlacementKind placement = PlacementKind::Contiguous;
  // The experts' schedule (moe/waves.hpp): waves of local experts, sequential or with the communication of
  // neighbouring waves overlapped on its own thread (paths whose traits say `waves`: block, rowwise).
  // Bit-identical results whatever it is; a run-time choice, not part of a checkpoint.
  WaveConfig waves;

  RouterConfig router() const;
  // Throws expar::Error naming the offending value and the fix.
  void validate(int ep_size) const;
};

}  // namespace expar
