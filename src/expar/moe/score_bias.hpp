#pragma once
// Auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the scores for SELECTION
// only (router.hpp). After a step, bias_e += rate · sign(mean_count − count_e), where the counts are summed
// over the dense data-parallel group so that every replica of the router keeps the same bias.
#include <cstdint>
#include <span>

namespace expar {

class Comm;

// counts: global routes per expert (already summed over the group). sign(0) = 0.
void update_score_bias(std::span<float> bias, std::span<const int64_t> counts, float rate);

// Collective over dp_group: all-reduces local_counts (rank-ordered sum, deterministic), then updates.
void update_score_bias(std::span<float> bias, std::span<const int64_t> local_counts, float rate,
                       Comm& dp_group);

}  // namespace expar
