#pragma once
// Renderings of a Plan: a readable table for people and JSON for machines (the `expar plan` outputs).
#include <nlohmann/json.hpp>
#include <string>

#include "expar/topo/plan.hpp"

namespace expar {

// Every figure of the plan (bytes as integers), the model shape, the layout and, for worlds of at most
// `max_group_world` ranks, the EP_MP, EP_DP and dense-gradient groups.
nlohmann::json plan_to_json(const Plan& plan, int max_group_world = 64);

std::string format_plan_table(const Plan& plan, int max_group_world = 16);

}  // namespace expar
