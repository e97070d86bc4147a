// `expar generate`: text from a trained checkpoint, greedy or with temperature / top-k sampling, on one rank
// or with expert parallelism (ranks as threads; the checkpoint reshards to the requested EP degree).
// Each new byte reruns the forward over the window (no KV cache yet: the inference engine is its own issue).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>

#include "expar/cli/commands.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/topo/training_layout.hpp"
#include "expar/train/checkpoint.hpp"

namespace expar::cli {

namespace {

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt = "In the beginning";
  int tokens = 200;
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: all
  uint64_t seed = 7;
  int ranks = 1;
  int ep = 1;
  std::string path = "rowwise";
};

int sample(const float* logits, int vocab, const GenerateArgs& a, uint64_t index) {
  if (a.temperature <= 0.0) return static_cast<int>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return logits[x] > logits[y]; });
  const int keep = a.top_k > 0 ? std::min(a.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(keep));
  for (int i = 0; i < keep; ++i)
    p[static_cast<size_t>(i)] =
        std::exp((logits[order[static_cast<size_t>(i)]] - logits[order[0]]) / a.temperature);
  double total = std::accumulate(p.begin(), p.end(), 0.0);
  double u = random_uniform(a.seed, 0x5A3, index) * total;
  for (int i = 0; i < keep; ++i) {
    u -= p[static_cast<size_t>(i)];
    if (u <= 0) return order[static_cast<size_t>(i)];
  }
  return order[static_cast<size_t>(keep - 1)];
}

int run_generate(const GenerateArgs& a) {
  CheckpointInfo info = read_checkpoint_info(a.checkpoint);
  ModelConfig config = info.model;
  config.moe.path = a.ep == 1 ? "local" : a.path;
  std::string text = a.prompt;
  std::mutex mutex;
  double seconds = 0;
  LaunchOptions launch;
  launch.ranks = a.ranks;
  run_ranks(launch, [&](Comm& world) {
    TrainingLayout layout(world.size(), a.ep);
    auto ep_mp = world.subgroup(layout.groups(TrainingGroup::EpMp), "ep_mp");
    MoeTransformer model(config, *ep_mp);
    load_checkpoint(a.checkpoint, model, nullptr);
    std::vector<int32_t> ids(a.prompt.begin(), a.prompt.end());
    for (auto& id : ids) id = static_cast<uint8_t>(id);
    Timer timer;
    std::string out;
    for (int i = 0; i < a.tokens; ++i) {
      const auto window =
          static_cast<int64_t>(std::min<size_t>(ids.size(), static_cast<size_t>(config.max_seq)));
      std::vector<int32_t> ctx(ids.end() - window, ids.end());
      Tensor logits = model.logits(ctx, 1, window);
      int32_t next = sample(logits.data<float>() + (window - 1) * config.vocab, config.vocab, a,
                            static_cast<uint64_t>(i));
      world.broadcast(&next, 1, DType::I32, 0);  // every rank continues with rank 0's choice
      ids.push_back(next);
      out.push_back(static_cast<char>(next));
    }
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      text += out;
      seconds = timer.seconds();
    }
  });
  std::printf("%s\n", text.c_str());
  std::fprintf(stderr, "[%d bytes in %.2f s, %.1f bytes/s, %d rank(s), EP %d]\n", a.tokens, seconds,
               a.tokens / std::max(seconds, 1e-9), a.ranks, a.ep);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a trained checkpoint");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--checkpoint", a->checkpoint, "Checkpoint directory written by expar train")->required();
  cmd->add_option("--prompt", a->prompt)->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Bytes to generate")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample among the k most likely bytes (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed)->capture_default_str();
  cmd->add_option("--ranks", a->ranks, "Ranks (threads)")->capture_default_str();
  cmd->add_option("--ep", a->ep, "EP degree (the checkpoint reshards to it)")->capture_default_str();
  cmd->add_option("--path", a->path, "Expert path when --ep > 1")->capture_default_str();
  table[cmd] = [a] { return run_generate(*a); };
}

}  // namespace expar::cli
