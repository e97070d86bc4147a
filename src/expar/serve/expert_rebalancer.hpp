#pragma once
// Rebalancing the experts of a running server (issue #36, item 3; `expar serve --eplb-window N
// --eplb-interval M`). The step loop hands it what the ranks counted in each engine step; every M engine
// steps it computes, for each MoE layer from that layer's expert loads of the last N steps, the placement
// DeepSeek's EPLB policy chooses (topo/expert_balance.hpp: replicate the hottest experts into the
// --redundant-experts slots, pack the slots onto the EP ranks). Each layer has its own placement, as in
// DeepSeek's EPLB, vLLM and SGLang, since each layer's hot experts differ; the next step's plan carries the
// tables of the layers whose placement changed, and every rank then moves those layers' expert weights
// through Comm before the step (infer::Engine::move_experts). A function of the counts alone, on the
// scheduler's side: one decision for all ranks and processes.
//
// It also keeps, per MoE layer, the imbalance of the rows each rank's experts computed over the same window,
// (max - mean) / mean, for /metrics, with or without rebalancing.
#include <cstdint>
#include <deque>
#include <vector>

#include "expar/topo/placement.hpp"

namespace expar::serve {

struct EplbOptions {
  int64_t window = 100;  // --eplb-window: engine steps whose loads a placement (and the imbalance) is from
  int64_t interval = 0;  // --eplb-interval: engine steps between placements; 0: the placement never changes
  bool rebalances() const { return interval > 0; }
  // Throws expar::Error naming the flag when a value is out of range.
  void validate() const;
};

// What the ranks reported for one step (serve/step_board.hpp adds them up).
struct StepLoad {
  std::vector<std::vector<int64_t>> layer_expert_tokens;  // [layer][E] rows per logical expert, all ranks
  std::vector<std::vector<int64_t>> layer_rows;           // [world rank][layer] rows its experts computed
  int64_t moved_bytes = 0;  // expert bytes received moving before the step, all ranks
  double move_seconds = 0;  // the slowest rank's move
};

class ExpertRebalancer {
 public:
  // `initial`: the placement the ranks loaded (InferenceLayout::placement()), every one of the model's
  // `layers` layers' at the start.
  ExpertRebalancer(EplbOptions options, const ExpertPlacement& initial, int layers);

  // Before an engine step: when a rebalance is due, the slot tables of the layers whose placement it
  // changes (in layer order), else empty (then also when due: the interval restarts either way). A layer
  // without rows in the window (a dense one, or one nothing reached) keeps its placement.
  std::vector<LayerSlotTable> before_step();
  // After an engine step: its loads join the window.
  void after_step(const StepLoad& load);

  // Per layer, (max - mean) / mean over the ranks of the rows computed in the window (0 for a layer without
  // rows, e.g. a dense one).
  std::vector<double> layer_imbalance() const;
  // Layer `layer`'s current table.
  const std::vector<int>& slot_experts(int layer) const;
  int64_t rebalances() const { return rebalances_; }  // rebalances that moved at least one layer

 private:
  EplbOptions options_;
  int num_experts_, redundant_, ep_size_;
  std::vector<std::vector<int>> slot_experts_;  // [layer]: the current tables
  std::deque<StepLoad> window_;                 // the last `window` engine steps' loads
  int64_t steps_since_ = 0;                     // engine steps since the last placement (or the start)
  int64_t rebalances_ = 0;
};

}  // namespace expar::serve
