#include "expar/infer/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar::infer {
namespace {

// The RNG stream of token sampling (other streams initialise parameters and data).
constexpr uint64_t kSamplingStream = 0x73616d706c65ULL;  // "sample"

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

void validate(const SamplingParams& p) {
  EXPAR_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0,
              "temperature={} must be a finite number >= 0 (0: greedy)", p.temperature);
  EXPAR_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0 && p.top_p <= 1.0,
              "top_p={} must be in (0, 1] (1: no nucleus cut)", p.top_p);
  EXPAR_CHECK(p.top_k >= 0, "top_k={} must be >= 0 (0: all tokens)", p.top_k);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t seed,
                     uint64_t index) {
  EXPAR_ASSERT(vocab > 0, "sampling over an empty vocabulary");
  if (p.temperature == 0.0) return argmax(logits, vocab);
  // Candidates in decreasing logit order, ties to the lower id (a total order: the same on every run).
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
  order.resize(static_cast<size_t>(keep));
  std::vector<double> prob(order.size());
  const double top = logits[order[0]];
  double total = 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    prob[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / p.temperature);
    total += prob[i];
  }
  size_t n = order.size();
  if (p.top_p < 1.0) {
    double cumulative = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cumulative += prob[i] / total;
      if (cumulative >= p.top_p) {
        n = i + 1;
        break;
      }
    }
    total = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(n), 0.0);
  }
  const double u = static_cast<double>(random_uniform(seed, kSamplingStream, index)) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cumulative += prob[i];
    if (u < cumulative) return order[i];
  }
  return order[n - 1];
}

}  // namespace expar::infer
