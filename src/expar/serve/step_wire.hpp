#pragma once
// Step plans and rank results as flat int64 arrays, the form in which `expar serve --transport mpi` moves
// them between processes (serve/mpi_steps.hpp): world rank 0 broadcasts each plan, every rank answers with
// what it sampled. Doubles travel as their bits, so a plan decodes to exactly what was encoded.
#include <cstdint>
#include <vector>

#include "expar/serve/scheduler.hpp"

namespace expar::serve {

// What one rank hands back after a step.
struct RankResult {
  int dp_rank = 0;
  bool samples = false;  // TP rank 0 of its replica: `tokens` are the replica's sampled tokens
  ReplicaTokens tokens;  // empty unless `samples`
  // [layers][E] tokens routed to each logical expert on this rank during the step, per layer
  std::vector<std::vector<int64_t>> layer_expert_tokens;
  std::vector<int64_t> layer_rows;  // [layers] rows this rank's experts computed during the step
  int64_t moved_bytes = 0;          // expert weight bytes this rank received moving to plan.expert_tables
  double move_seconds = 0;          // how long that move took on this rank
};

std::vector<int64_t> encode_plan(const StepPlan& plan);
// Throws expar::InternalError when `wire` is not an encode_plan result (truncated or trailing values).
StepPlan decode_plan(const std::vector<int64_t>& wire);

std::vector<int64_t> encode_result(const RankResult& result);
RankResult decode_result(const int64_t* wire, size_t size);

}  // namespace expar::serve
