#include "expar/bench/layer_bench.hpp"

#include "expar/core/error.hpp"

namespace expar::bench {

void validate_setup(const LayerBenchSetup& s) {
  EXPAR_CHECK(s.ranks >= 1 && s.threads >= 1, "--ranks {} --threads {}: both must be at least 1", s.ranks,
              s.threads);
  EXPAR_CHECK(s.tokens >= 1 && s.model_dim >= 1 && s.hidden_dim >= 1,
              "--tokens {} --d-model {} --expert-hidden {}: every size must be at least 1", s.tokens,
              s.model_dim, s.hidden_dim);
  EXPAR_CHECK(s.top_k >= 1 && s.top_k <= s.experts, "--experts-per-token {} must be in [1, --experts {}]",
              s.top_k, s.experts);
  EXPAR_CHECK(s.repeats >= 1 && s.warmup >= 0, "--repeats {} --warmup {}: need repeats >= 1, warmup >= 0",
              s.repeats, s.warmup);
}

nlohmann::json setup_json(const LayerBenchSetup& s) {
  return {{"ranks", s.ranks}, {"threads", s.threads}, {"tokens_per_rank", s.tokens},
          {"d", s.model_dim}, {"h", s.hidden_dim},    {"experts", s.experts},
          {"top_k", s.top_k}, {"repeats", s.repeats}, {"warmup", s.warmup},
          {"seed", s.seed}};
}

}  // namespace expar::bench
