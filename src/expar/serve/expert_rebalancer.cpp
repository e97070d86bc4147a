#include "expar/serve/expert_rebalancer.hpp"

#include <algorithm>

#include "expar/core/error.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar::serve {

void EplbOptions::validate() const {
  EXPAR_CHECK(
      window >= 1 && window <= (int64_t{1} << 30),
      "--eplb-window {} must be in [1, 2^30] engine steps (the expert loads a placement is computed from)",
      window);
  EXPAR_CHECK(interval >= 0 && interval <= (int64_t{1} << 30),
              "--eplb-interval {} must be in [0, 2^30] engine steps (0: never rebalance)", interval);
}

ExpertRebalancer::ExpertRebalancer(EplbOptions options, const ExpertPlacement& initial, int layers)
    : options_(options),
      num_experts_(initial.num_experts()),
      redundant_(initial.redundant()),
      ep_size_(initial.ep_size()) {
  options_.validate();
  EXPAR_CHECK(layers >= 1, "an expert rebalancer for a model of {} layers: the model needs a layer", layers);
  std::vector<int> table;
  for (int s = 0; s < initial.num_slots(); ++s) table.push_back(initial.slot_expert(s));
  slot_experts_.assign(static_cast<size_t>(layers), table);
}

const std::vector<int>& ExpertRebalancer::slot_experts(int layer) const {
  EXPAR_CHECK(layer >= 0 && static_cast<size_t>(layer) < slot_experts_.size(),
              "layer {} is outside the model's {} layers", layer, slot_experts_.size());
  return slot_experts_[static_cast<size_t>(layer)];
}

std::vector<LayerSlotTable> ExpertRebalancer::before_step() {
  if (!options_.rebalances() || steps_since_ < options_.interval) return {};
  steps_since_ = 0;
  std::vector<LayerSlotTable> changed;
  for (size_t l = 0; l < slot_experts_.size(); ++l) {
    std::vector<double> loads(static_cast<size_t>(num_experts_), 0.0);
    for (const StepLoad& step : window_)
      if (l < step.layer_expert_tokens.size())
        for (size_t e = 0; e < step.layer_expert_tokens[l].size() && e < loads.size(); ++e)
          loads[e] += static_cast<double>(step.layer_expert_tokens[l][e]);
    if (std::all_of(loads.begin(), loads.end(), [](double x) { return x == 0; })) continue;
    ExpertBalanceInput in;
    in.loads = std::move(loads);
    in.redundant = redundant_;
    in.ep_size = ep_size_;
    const ExpertBalance balance = balance_experts(in);
    std::vector<int> table;
    for (const PhysicalSlot& s : balance.slots) table.push_back(s.expert);
    if (table == slot_experts_[l]) continue;
    slot_experts_[l] = table;
    changed.push_back({static_cast<int>(l), std::move(table)});
  }
  if (!changed.empty()) ++rebalances_;
  return changed;
}

void ExpertRebalancer::after_step(const StepLoad& load) {
  window_.push_back(load);
  while (static_cast<int64_t>(window_.size()) > options_.window) window_.pop_front();
  ++steps_since_;
}

std::vector<double> ExpertRebalancer::layer_imbalance() const {
  std::vector<std::vector<double>> rows;  // [rank][layer], over the window
  for (const StepLoad& step : window_)
    for (size_t r = 0; r < step.layer_rows.size(); ++r) {
      if (rows.size() <= r) rows.resize(r + 1);
      if (rows[r].size() < step.layer_rows[r].size()) rows[r].resize(step.layer_rows[r].size(), 0.0);
      for (size_t l = 0; l < step.layer_rows[r].size(); ++l)
        rows[r][l] += static_cast<double>(step.layer_rows[r][l]);
    }
  return expar::layer_imbalance(rows).per_layer;
}

}  // namespace expar::serve
