#include "expar/infer/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/timer.hpp"
#include "expar/infer/rank_memory_plan.hpp"
#include "expar/io/token_file.hpp"

namespace expar::infer {

double token_loss(const float* logits, int64_t vocab, int32_t target) {
  double max = logits[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(logits[v]));
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - max);
  return std::log(sum) + max - static_cast<double>(logits[target]);
}

EvaluateResult evaluate(const EvaluateOptions& options, const std::string& checkpoint,
                        const std::vector<int32_t>& tokens) {
  const ModelSpec spec = open_model_spec(checkpoint, options.engine.format);
  const ModelConfig& config = spec.config;
  EXPAR_CHECK(tokens.size() >= 2,
              "evaluation needs at least 2 tokens (one to predict), got {}: pass more data", tokens.size());
  check_tokens_below(tokens, config.vocab,
                     "the evaluation data (model vocabulary " + std::to_string(config.vocab) + ")");
  const int64_t window = options.window > 0 ? options.window : config.max_seq;
  EXPAR_CHECK(window >= 1 && window <= config.max_seq,
              "--window {} must lie in [1, max_position_embeddings={}]: pass a shorter window", window,
              config.max_seq);
  const InferenceLayout layout = inference_layout(options.engine, config);
  FitRequest fit;
  fit.spec = &spec;
  fit.options = options.engine;
  fit.kv_tokens = window;  // a window's positions
  fit.kv_fix = [](int64_t positions) {
    return std::optional<std::string>("--window " + std::to_string(positions));
  };
  check_fits_before_loading(fit);
  const auto predicted = static_cast<int64_t>(tokens.size()) - 1;
  const int64_t windows = (predicted + window - 1) / window;
  const int dp = layout.dp();
  std::vector<double> replica_loss(static_cast<size_t>(dp), 0.0);
  std::mutex mutex;
  Timer timer;
  LaunchOptions launch;
  launch.ranks = layout.world();
  launch.compute_threads = options.engine.compute_threads;
  run_ranks(launch, [&](Comm& world) {
    std::unique_ptr<TensorStore> store = open_store(spec);
    RankWeights weights = load_rank_weights(*store, spec, layout, world.rank(), options.engine.weight_dtype);
    store.reset();  // the weights used in place keep their mapping; the rest is released
    Engine engine(layout, world, std::move(weights), engine_options_for(options.engine));
    const int r = engine.dp_rank();
    double loss = 0.0;
    // Every replica runs the same number of rounds; one without a window in a round pads (no sequences).
    for (int64_t round = 0; round * dp < windows; ++round) {
      const int64_t w = round * dp + r;
      if (w >= windows) {
        engine.prefill({}, {});
        continue;
      }
      const int64_t first = w * window, n = std::min(window, predicted - first);
      const std::vector<int32_t> input(tokens.begin() + first, tokens.begin() + first + n);
      const int id = engine.add_sequence(n);
      const Tensor logits = engine.prefill(std::vector<int>{id}, {input}, PrefillLogits::AllRows);
      engine.remove_sequence(id);
      for (int64_t t = 0; t < n; ++t)
        loss += token_loss(logits.data<float>() + t * config.vocab, config.vocab,
                           tokens[static_cast<size_t>(first + t + 1)]);
    }
    if (layout.rank_info(world.rank()).tp_rank == 0) {
      std::lock_guard lock(mutex);
      replica_loss[static_cast<size_t>(r)] = loss;
    }
  });
  EvaluateResult result;
  result.format = spec.format;
  result.ep_degree = layout.ep_degree();
  result.predicted = predicted;
  result.windows = windows;
  double total = 0.0;
  for (double l : replica_loss) total += l;  // in replica order: the same sum for any run of this layout
  result.mean_loss = total / static_cast<double>(predicted);
  result.perplexity = std::exp(result.mean_loss);
  result.tokens_per_s = static_cast<double>(predicted) / std::max(timer.seconds(), 1e-9);
  return result;
}

}  // namespace expar::infer
