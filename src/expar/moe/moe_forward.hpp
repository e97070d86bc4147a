#pragma once
// One MoE block's forward, the only one: router -> route map -> path dispatch -> grouped experts -> path
// combine. Training's MoeLayer and the inference engine both run it, so a routing, placement or expert
// feature is written once. What differs between them is data: the path (and its collective levels), the
// group the route map's sources span, the capacity policy, whether activations are kept for a backward, and
// rows the caller adds to the combine (the engine's tensor-parallel shared expert).
#include <cstdint>
#include <functional>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/moe_config.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/replica_deal.hpp"
#include "expar/moe/route_map.hpp"
#include "expar/moe/router.hpp"
#include "expar/moe/wave_schedule.hpp"

namespace expar {

class Comm;

struct MoeMetrics {
  double aux_loss = 0.0;               // L_aux (unscaled; over the forward's loss scope)
  double z_loss = 0.0;                 // L_z (unscaled; likewise)
  double drop_rate = 0.0;              // dropped / (T·K), mean over the EP group's ranks
  double utilisation = 0.0;            // received rows / capacity rows, max over the EP group's ranks
  int64_t dropped = 0;                 // this rank's dropped routes
  int64_t routes = 0;                  // this rank's T·K
  std::vector<int64_t> expert_counts;  // [E] this rank's routes per expert (before capacity)
};

struct MoeState {
  RouterState router;  // keeps the layer input x (by reference): the recomputation redoes dispatch from it
  RouteMap routes;
  PathState path;
  ExpertMlpState experts;                    // no-wave schedule
  std::vector<ExpertMlpState> expert_waves;  // wave schedules: one per wave
  MoeMetrics metrics;
  // This rank's seconds of the last forward's / backward's dispatch -> experts -> combine section
  // (moe/wave_schedule.hpp), whatever the schedule: what `expar bench waves` reads for eq. 10.
  WaveTimes forward_times, backward_times;
  // Set by a forward under activation recomputation: path and experts were dropped after the forward, and
  // backward rebuilds them first (MoeLayer::set_recompute).
  bool recomputed = false;
  int microbatch = -1;  // MoeLayer::set_microbatch at the forward (its recomputation reuses it)
  WaveConfig waves;     // the forward's expert schedule (its backward and recomputation run the same)
};

// The parameters one forward reads on this rank (views; their owner keeps them alive).
struct MoeWeights {
  const Tensor* w_router = nullptr;        // [E, d]
  const Tensor* score_bias = nullptr;      // [E] selection-only bias, or null
  const Tensor* router_bias = nullptr;     // [E] added to the logits (gpt-oss), or null
  const ExpertWeights* experts = nullptr;  // the experts of this rank's partition, biases and activation
};

// How one forward runs.
struct MoeForwardOptions {
  ExpertPath* path = nullptr;
  // The route map's sources: the ranks whose tokens share the experts (their requests are counted in one
  // all-gather); null: this rank's tokens are the only source (a decode replica whose ranks all hold the
  // same tokens). `partition`: this rank's expert partition (-1: its rank among the sources).
  Comm* sources = nullptr;
  int partition = -1;
  // The layer's replica deal (replica_deal.hpp): the route map continues it and moe_forward moves it on.
  // Null: every map deals each replicated expert's routes from its first replica (training: large batches,
  // and a resumed run must route as the uninterrupted one).
  ReplicaDeal* replica_deal = nullptr;
  CapacityPolicy capacity;                             // inference: dropless
  PayloadFormat dispatch_format = PayloadFormat::F32;  // what the path's dispatch hands the experts
  RouterLossScope loss_scope;
  WaveConfig waves;               // the expert schedule (one wave: none)
  bool keep_activations = true;   // the expert MLP's state, for a backward
  bool scratch_dispatch = false;  // PathState::scratch_dispatch
  int microbatch = -1;            // PathState::microbatch
  // Called after the experts ran and before combine (no-wave schedule only): the caller may set the agrs
  // path's combine addend from the gathered tokens.
  std::function<void(const RouteMap&, PathState&)> before_combine;
};

// x [T, d] f32 -> y [T, d]. Fills state: the router's, the route map, the path's, the expert activations
// (with keep_activations), the metrics and the forward's times. Collective over the sources and the path's
// groups.
Tensor moe_forward(const MoeConfig& config, const ExpertPlacement& placement, const MoeWeights& weights,
                   const Tensor& x, const MoeForwardOptions& options, MoeState& state);

// The rows one wave of experts computes: wave.begin..end's rows [row_begin, row_end) of the expert-side
// buffer (contiguous), and their offsets rebased to row_begin, so a wave runs the no-wave step's products.
struct ExpertWaveRows {
  int64_t row_begin = 0, row_end = 0;
  std::vector<int64_t> offsets;
};
ExpertWaveRows expert_wave_rows(const RouteMap& map, ExpertWave wave);

// dispatch -> experts -> combine of x over state.routes under state.waves (fills state.path, the expert
// states and forward_times); returns y. moe_forward's second half, and what a recomputing backward reruns.
Tensor moe_experts_forward(ExpertPath& path, const ExpertWeights& experts, const Tensor& x,
                           const Tensor& topk_weight, const MoeForwardOptions& options, MoeState& state);

}  // namespace expar
