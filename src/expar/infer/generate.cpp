#include "expar/infer/generate.hpp"

#include <fmt/format.h>

#include <mutex>

#include "expar/comm/launcher.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/infer/rank_memory_plan.hpp"

namespace expar::infer {

int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t v = logits.dim(1);
  const float* p = logits.data<float>() + row * v;
  int64_t best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (p[i] > p[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<int32_t> greedy_generate(Engine& engine, const std::vector<int32_t>& prompt, int max_new) {
  EXPAR_ASSERT(max_new >= 0, "max_new={} must not be negative", max_new);
  const bool idle = prompt.empty();
  std::vector<int> ids;
  std::vector<std::vector<int32_t>> tokens;
  if (!idle) {
    ids.push_back(engine.add_sequence(static_cast<int64_t>(prompt.size()) + max_new));
    tokens.push_back(prompt);
  }
  Tensor logits = engine.prefill(ids, tokens, PrefillLogits::LastRow);
  std::vector<int32_t> out;
  for (int step = 0; step < max_new; ++step) {
    std::vector<int32_t> next;
    if (!idle) {
      next.push_back(argmax_row(logits, logits.dim(0) - 1));
      out.push_back(next.back());
    }
    if (step + 1 == max_new) break;  // the last token needs no forward pass
    logits = engine.decode(ids, next);
  }
  if (!idle) engine.remove_sequence(ids[0]);
  return out;
}

EngineOptions engine_options_for(const GenerateOptions& options) {
  EngineOptions o;
  o.decode_moe = options.decode_moe;
  o.precision = options.precision;
  return o;
}

InferenceLayout inference_layout(const GenerateOptions& options, const ModelConfig& config) {
  return InferenceLayout(InferenceConfig(options, config.moe.router.num_experts));
}

GenerateResult generate(const GenerateOptions& options, const std::string& checkpoint,
                        const std::vector<int32_t>& prompt, int max_new) {
  const ModelSpec spec = open_model_spec(checkpoint, options.format);
  const ModelConfig& config = spec.config;
  for (int32_t t : prompt)
    EXPAR_CHECK(t >= 0 && t < config.vocab,
                "prompt token {} is outside the model's vocabulary [0, {}): pass token ids of this model", t,
                config.vocab);
  const InferenceLayout layout = inference_layout(options, config);
  check_decode_moe(layout, options.decode_moe);  // refuse before loading anything
  FitRequest fit;
  fit.spec = &spec;
  fit.options = options;
  fit.kv_tokens = static_cast<int64_t>(prompt.size()) + max_new;
  fit.kv_fix = [&](int64_t positions) -> std::optional<std::string> {
    if (positions <= static_cast<int64_t>(prompt.size())) return std::nullopt;
    return fmt::format("--tokens {}", positions - static_cast<int64_t>(prompt.size()));
  };
  check_fits_before_loading(fit);
  GenerateResult result;
  result.format = spec.format;
  result.ep_degree = layout.ep_degree();
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = layout.world();
  launch.compute_threads = options.compute_threads;
  result.memory.resize(static_cast<size_t>(layout.world()));
  run_ranks(launch, [&](Comm& world) {
    std::unique_ptr<TensorStore> store = open_store(spec);
    RankWeights w = load_rank_weights(*store, spec, layout, world.rank(), options.weight_dtype);
    store.reset();  // the weights used in place keep their mapping; the rest is released
    Engine engine(layout, world, std::move(w), engine_options_for(options));
    const bool serving = engine.dp_rank() == 0;
    auto tokens = greedy_generate(engine, serving ? prompt : std::vector<int32_t>{}, max_new);
    {
      std::lock_guard lock(mutex);
      result.memory[static_cast<size_t>(world.rank())] = current_tracker().snapshot();
    }
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      const EngineStats& s = engine.stats();
      result.tokens = std::move(tokens);
      result.prefill_tokens_per_s =
          s.prefill_seconds > 0 ? static_cast<double>(s.prefill_tokens) / s.prefill_seconds : 0.0;
      result.decode_tokens_per_s =
          s.decode_seconds > 0 ? static_cast<double>(s.decode_tokens) / s.decode_seconds : 0.0;
    }
  });
  result.peak_rss_bytes = peak_resident_bytes();
  return result;
}

}  // namespace expar::infer
