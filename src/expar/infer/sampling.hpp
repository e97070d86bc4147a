#pragma once
// Next-token choice from one row of logits: greedy, or temperature / top-k / top-p sampling driven by the
// counter-based RNG (core/rng), so the token at step `index` of a request with seed `seed` is a pure
// function of (logits, parameters, seed, index) — the same on any layout and in any batch.
#include <cstdint>

namespace expar::infer {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy (arg-max, ties to the lower id)
  double top_p = 1.0;        // keep the smallest most-likely set whose probability reaches top_p; (0, 1]
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
};

// Throws expar::Error naming the parameter when a value is outside its range (temperature finite and >= 0,
// top_p in (0, 1], top_k >= 0).
void validate(const SamplingParams& params);

// The token drawn from logits [vocab] at step `index` of the stream `seed`.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t seed,
                     uint64_t index);

}  // namespace expar::infer
