#pragma once
// The MoE layer: router -> capacity policy + route map -> execution path dispatch -> grouped expert MLP ->
// execution path combine, and the explicit backward of the same chain. The same layer object runs any
// registered path (chosen by name), and with path "local" on one rank it is the reference every EP path is
// held to.
//
// Parameters: the router weight W_r [E, d] (replicated on every rank of the EP group), optional score
// bias [E] and (gpt-oss) router logit bias [E]; the E_L local experts' w1, w3 [E_L, h, d] and w2 [E_L, d, h],
// and (gpt-oss) their biases b1, b3 [E_L, h] and b2 [E_L, d]. init_params(seed) gives global
// expert e the same values whatever the EP size or placement (one RNG stream per (layer name, expert)).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/moe_config.hpp"
#include "expar/moe/moe_forward.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/route_map.hpp"
#include "expar/moe/router.hpp"
#include "expar/moe/wave_schedule.hpp"
#include "expar/moe/waves.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class Comm;

struct MoeParams {
  Tensor w_router;        // [E, d]
  Tensor score_bias;      // [E] (defined only with use_score_bias)
  Tensor router_bias;     // [E] added to the logits (defined only with MoeConfig::router_bias)
  ExpertWeights experts;  // local experts
};

// The layout-independent initialisation behind MoeLayer::init_params: W_r ~ N(0, 1/d) from the stream of
// "<name>.router"; global expert e's w1, w3 ~ N(0, 1/d) and w2 ~ N(0, 1/h) from the streams of
// "<name>.experts.<e>.w1|w3|w2"; the score bias, router bias and expert biases (if defined) 0. Fills the
// local experts of `ep_rank`.
void init_moe_params(MoeParams& params, const MoeConfig& config, const ExpertPlacement& placement,
                     int ep_rank, const std::string& name, uint64_t seed);
// init_moe_params's router weight alone (w_router [E, d]): for a caller that routes before it builds a layer
// (a benchmark placing replicas by the loads its routes will give).
void init_router_weight(Tensor& w_router, const std::string& name, uint64_t seed);

struct MoeGrads {
  Tensor w_router;        // [E, d]
  Tensor router_bias;     // [E] (with MoeConfig::router_bias)
  ExpertWeights experts;  // local experts
};

// Resources a model shares between its MoE blocks (rowwise path): one symmetric heap over the EP group and
// one lease pool on it for the dispatch payloads saved for backward (seed 000 §5.7). Null: the path makes
// its own (private per block).
struct MoeSharedResources {
  SymmetricHeap* heap = nullptr;
  LeasePool* lease_pool = nullptr;
  int block_index = -1;  // tags this block's leases in the pool's messages
};

class MoeLayer {
 public:
  // ep_group: the EP_MP group (size M_E); it must outlive the layer (and so must `shared`'s heap and pool).
  MoeLayer(MoeConfig config, MoeExecution execution, Comm& ep_group, std::string name = "moe",
           MoeSharedResources shared = {});
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeConfig& config() const { return config_; }
  const MoeExecution& execution() const { return execution_; }
  const ExpertPlacement& placement() const { return placement_; }
  const std::string& name() const { return name_; }
  int ep_rank() const;
  MoeParams& params() { return params_; }
  const MoeParams& params() const { return params_; }
  // Writable access forgets that the expert gradients are zero (zero_grads), since the caller may write them.
  MoeGrads& grads() {
    expert_grads_zero_ = false;
    return grads_;
  }
  const MoeGrads& grads() const { return grads_; }
  ExpertPath& path() { return *path_; }

  // Deterministic, layout-independent initialisation (normal, std 1/sqrt(fan-in)); the bias starts at 0.
  void init_params(uint64_t seed);
  // Zeroes every gradient, and lets the next backward write the expert weights' gradients instead of adding
  // them (GradientUpdate::IntoZeros: the same values, without reading them back); later backwards add.
  void zero_grads();

  // Activation recomputation (seed 000 §5.7): a forward keeps only the router state (which holds the input
  // x by reference) and the route map; the dispatch payload goes to shared scratch (rowwise: no lease), and
  // the path state and expert activations (w1·x, w3·x, the gathered expert outputs) are dropped. Its
  // backward first re-dispatches x with the saved route map, re-runs the expert MLP and the combine gather,
  // then runs the ordinary backward: the same arithmetic in the same order, so gradients are bit-identical.
  // Costs one more dispatch and combine transfer and one more expert forward per backward. The router is not
  // recomputed: its backward needs its state anyway, and keeping the route map avoids the route-map
  // collective in backward and any dependence on a score bias updated in between. Parameters must not
  // change between a forward and its backward (true within a training step). Applies to the forwards that
  // run while it is set; a state remembers how its forward ran.
  void set_recompute(bool recompute) { recompute_ = recompute; }
  bool recompute() const { return recompute_; }
  // The microbatch the following forwards belong to (-1: none), carried into lease tags and their messages.
  void set_microbatch(int microbatch) { microbatch_ = microbatch; }
  // Which tokens the router's aux and z losses of the following forwards are over (RouterLossScope; under
  // context parallelism chunks of the same sequences over the CP group). The default: this rank's tokens.
  // Collective over scope.group in every forward; the group must outlive the forwards that use it.
  void set_loss_scope(RouterLossScope scope) { loss_scope_ = scope; }
  // The expert schedule of the following forwards (and of their backwards, which follow their forward's);
  // validated like MoeExecution::waves. Results are the same bits whatever it is.
  void set_waves(WaveConfig waves);
  // Another table of the same E experts in the same S slots over the same ranks (EPLB), for the forwards
  // that follow; between steps only. The slots' weights are the caller's to move (train/expert_rebalance).
  void set_placement(const ExpertPlacement& next);

  // x [T, d] -> y [T, d]; fills state (saved for backward) and state.metrics. Collective over the EP group.
  Tensor forward(const Tensor& x, MoeState& state);
  // grad_y [T, d] -> grad_x [T, d]; ADDS parameter gradients into grads(). Collective over the EP group.
  Tensor backward(const Tensor& grad_y, MoeState& state);

 private:
  MoeConfig config_;
  MoeExecution execution_;
  Comm& ep_group_;
  std::string name_;
  ExpertPlacement placement_;
  std::unique_ptr<ExpertPath> path_;
  // Rebuilds what a recomputing forward dropped: dispatch (into scratch), expert MLP, combine gather.
  void recompute_forward(MoeState& state);
  // Views of the parameters, and how this layer's forwards run (moe/moe_forward.hpp).
  MoeWeights weights() const;
  MoeForwardOptions forward_options() const;
  // combine backward -> expert backward -> dispatch backward (adds the expert weight gradients); returns
  // the layer input's gradient through the experts, and the routing weights' gradient.
  Tensor experts_backward(const Tensor& grad_y, MoeState& state, Tensor& grad_topk_weight);

  MoeParams params_;
  MoeGrads grads_;
  bool recompute_ = false;
  // Whether the expert weights' gradients are all zero: set by zero_grads, cleared by a backward and by
  // writable access to grads().
  bool expert_grads_zero_ = false;
  int microbatch_ = -1;
  RouterLossScope loss_scope_;
};

}  // namespace expar
