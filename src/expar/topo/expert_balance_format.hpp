#pragma once
// Renderings of an ExpertBalance for `expar plan --expert-load`: a table for people (each rank's logical
// experts with replicas marked, its load, the imbalance before and after) and JSON for machines.
#include <nlohmann/json.hpp>
#include <string>

#include "expar/topo/expert_balance.hpp"

namespace expar {

std::string format_expert_balance(const ExpertBalance& balance);

// Every field of the placement; the contiguous figures are null when M does not divide E.
nlohmann::json expert_balance_json(const ExpertBalance& balance);

}  // namespace expar
