#include "expar/nn/cross_entropy.hpp"

#include <cmath>

#include "expar/nn/check.hpp"

namespace expar::nn {

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t normalizer) {
  check_f32_matrix(logits, "cross_entropy", "logits");
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  EXPAR_CHECK(vocab > 0, "cross_entropy: logits have shape {}: the vocabulary must not be empty",
              shape_string(logits.shape()));
  check_i32(targets, "cross_entropy", "targets", n);
  const int32_t* t = targets.data<int32_t>();
  CrossEntropyResult result;
  for (int64_t i = 0; i < n; ++i) {
    EXPAR_CHECK(
        t[i] == kIgnoreTarget || (t[i] >= 0 && t[i] < vocab),
        "cross_entropy: target {} at row {} is outside [0, {}) and is not the ignore index {}: check the "
        "data against vocab_size",
        t[i], i, vocab, kIgnoreTarget);
    if (t[i] != kIgnoreTarget) ++result.counted;
  }
  EXPAR_CHECK(normalizer == -1 || normalizer > 0,
              "cross_entropy: normalizer={} must be positive, or -1 for the number of counted rows",
              normalizer);
  const double norm = normalizer > 0 ? static_cast<double>(normalizer)
                                     : static_cast<double>(result.counted > 0 ? result.counted : 1);
  const float inv_norm = static_cast<float>(1.0 / norm);
  result.grad_logits = Tensor::empty({n, vocab});
  const float* pl = logits.data<float>();
  float* pg = result.grad_logits.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* z = pl + i * vocab;
    float* g = pg + i * vocab;
    if (t[i] == kIgnoreTarget) {
      for (int64_t j = 0; j < vocab; ++j) g[j] = 0.0f;
      continue;
    }
    float max = z[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::fmax(max, z[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) {
      const float e = std::exp(z[j] - max);
      g[j] = e;
      sum += e;
    }
    const double log_sum = std::log(sum);
    result.loss_sum += log_sum - static_cast<double>(z[t[i]] - max);
    const float scale = static_cast<float>(1.0 / sum) * inv_norm;
    for (int64_t j = 0; j < vocab; ++j) g[j] *= scale;
    g[t[i]] -= inv_norm;
  }
  result.loss = result.loss_sum / norm;
  return result;
}

}  // namespace expar::nn
