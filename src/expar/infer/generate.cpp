#include "expar/infer/generate.hpp"

#include <filesystem>
#include <mutex>

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/hf_config.hpp"

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
  EXPAR_CHECK(max_new >= 0, "max_new={} must not be negative", max_new);
  const bool idle = prompt.empty();
  std::vector<int> ids;
  std::vector<std::vector<int32_t>> tokens;
  if (!idle) {
    ids.push_back(engine.add_sequence(static_cast<int64_t>(prompt.size()) + max_new));
    tokens.push_back(prompt);
  }
  Tensor logits = engine.prefill(ids, tokens);
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

GenerateResult generate(const GenerateOptions& options, const std::string& checkpoint_dir,
                        const std::vector<int32_t>& prompt, int max_new) {
  namespace fs = std::filesystem;
  const fs::path dir(checkpoint_dir);
  const bool ours = fs::exists(dir / "manifest.json");
  EXPAR_CHECK(ours || fs::exists(dir / "config.json"),
              "'{}' holds neither manifest.json (an expar checkpoint) nor config.json (a Hugging Face "
              "checkpoint): pass a checkpoint directory",
              checkpoint_dir);
  const ModelConfig config = ours ? model_config_from_manifest(dir) : mixtral_config(dir);
  InferenceConfig ic;
  ic.tp = options.tp;
  ic.dp = options.dp;
  ic.enable_expert_parallel = options.enable_expert_parallel;
  ic.ep_degree = options.ep_degree;
  ic.num_experts = config.moe.num_experts;
  ic.placement = options.placement;
  const InferenceLayout layout(ic);
  GenerateResult result;
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = layout.world();
  launch.compute_threads = options.compute_threads;
  run_ranks(launch, [&](Comm& world) {
    std::unique_ptr<TensorStore> store;
    if (ours)
      store = ExparCheckpointStore::open(dir);
    else
      store = ShardedStore::open(dir);
    RankWeights w = load_rank_weights(*store, ours ? expar_weight_names() : mixtral_weight_names(), config,
                                      layout, world.rank());
    Engine engine(layout, world, std::move(w));
    const bool serving = engine.dp_rank() == 0;
    auto tokens = greedy_generate(engine, serving ? prompt : std::vector<int32_t>{}, max_new);
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
  return result;
}

}  // namespace expar::infer
