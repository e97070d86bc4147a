#include "expar/moe/score_bias.hpp"

#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

void update_score_bias(std::span<float> bias, std::span<const int64_t> counts, float rate) {
  EXPAR_ASSERT(bias.size() == counts.size(), "score bias has {} entries but {} expert counts were given",
               bias.size(), counts.size());
  if (counts.empty()) return;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  // Compare count·E with total rather than count with total/E: exact in integers.
  const auto e_count = static_cast<int64_t>(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t scaled = counts[e] * e_count;
    const float sign = scaled < total ? 1.0f : (scaled > total ? -1.0f : 0.0f);
    bias[e] += rate * sign;
  }
}

void update_score_bias(std::span<float> bias, std::span<const int64_t> local_counts, float rate,
                       Comm& dp_group) {
  std::vector<int64_t> counts(local_counts.begin(), local_counts.end());
  dp_group.all_reduce(std::span<int64_t>(counts), ReduceOp::Sum);
  update_score_bias(bias, counts, rate);
}

}  // namespace expar
