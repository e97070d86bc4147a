#include "expar/serve/runtime.hpp"

#include <algorithm>
#include <unordered_map>

#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/infer/sampling.hpp"

namespace expar::serve {
namespace {

// FNV-1a over the bytes of a logits row: equal hashes <=> (almost surely) bit-identical rows.
uint64_t hash_floats(const float* p, int64_t n) {
  uint64_t h = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(float)); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  return h;
}

}  // namespace

// The hand-off between the step loop and the rank threads (all in this process).
struct Runtime::Board {
  std::mutex mutex;
  std::condition_variable changed;
  int world = 0, loaded = 0, arrived = 0;
  int64_t kv_bytes_per_token = 0;  // the largest over ranks
  uint64_t generation = 0;         // one per published step
  const StepPlan* plan = nullptr;
  StepTokens tokens;
  bool done = false;    // no more steps: ranks return
  std::string failure;  // the first rank's error

  void fail(const std::string& message) {
    {
      std::lock_guard lock(mutex);
      if (failure.empty()) failure = message.empty() ? "a rank failed without a message" : message;
    }
    changed.notify_all();
  }
};

Runtime::Runtime(RuntimeOptions options) : options_(std::move(options)), board_(std::make_unique<Board>()) {
  options_.scheduler.validate();
  EXPAR_CHECK(options_.kv_cache_mb >= 1 && options_.kv_cache_mb <= (int64_t{1} << 30),
              "--kv-cache-mb {} must be in [1, 2^30]", options_.kv_cache_mb);
  spec_ = infer::open_model_spec(options_.path, options_.model.format);
  layout_ = std::make_unique<InferenceLayout>(infer::inference_layout(options_.model, spec_.config));
  infer::check_decode_moe(*layout_, options_.model.decode_moe);
  board_->world = layout_->world();
  ranks_ = std::thread([this] {
    LaunchOptions launch;
    launch.ranks = layout_->world();
    launch.compute_threads = options_.model.compute_threads;
    try {
      run_ranks(launch, [this](Comm& world) { rank_main(world); });
    } catch (const std::exception& e) {
      board_->fail(e.what());
    }
  });
  {
    std::unique_lock lock(board_->mutex);
    board_->changed.wait(lock, [&] { return board_->loaded == board_->world || !board_->failure.empty(); });
  }
  if (!failure().empty()) {
    ranks_.join();
    throw Error(fmt::format("expar serve: loading {} failed: {}", options_.path, failure()));
  }
  try {
    const int64_t kv_tokens = options_.kv_cache_mb * (int64_t{1} << 20) / board_->kv_bytes_per_token;
    EXPAR_CHECK(kv_tokens >= 1, "--kv-cache-mb {} holds no token of this model ({} bytes per token per rank)",
                options_.kv_cache_mb, board_->kv_bytes_per_token);
    scheduler_ = std::make_unique<Scheduler>(options_.scheduler, layout_->dp(), kv_tokens,
                                             spec_.config.max_seq, metrics_);
  } catch (...) {
    shutdown(true);  // the ranks are loaded and waiting: end them before the error leaves
    throw;
  }
  stepper_ = std::thread([this] { step_loop(); });
}

Runtime::~Runtime() {
  shutdown(true);
}

void Runtime::shutdown(bool cancel_in_flight) {
  if (scheduler_) scheduler_->stop(cancel_in_flight);
  if (stepper_.joinable()) stepper_.join();
  {
    std::lock_guard lock(board_->mutex);
    board_->done = true;
  }
  board_->changed.notify_all();
  if (ranks_.joinable()) ranks_.join();
}

std::string Runtime::failure() const {
  std::lock_guard lock(board_->mutex);
  return board_->failure;
}

bool Runtime::prefill_phase(const StepPlan& plan) const {
  // With cross-DP EP the two phases sum a token's expert outputs in different orders (decode: over TP,
  // then DP; prefill: over DP, then TP), so a decode token would change bits with the phase its neighbours
  // put the step in. Batch invariance then runs every step as a prefill (same bytes moved: an all-gather
  // and a reduce-scatter instead of an all-reduce over TP).
  return plan.prefill || (options_.batch_invariant && layout_->dp() > 1);
}

void Runtime::rank_main(Comm& world) {
  Board& board = *board_;
  try {
    std::unique_ptr<infer::TensorStore> store = infer::open_store(spec_);
    infer::RankWeights weights = infer::load_rank_weights(*store, spec_, *layout_, world.rank());
    store.reset();
    const nn::AttentionShape& attn = weights.local_attn;
    const int64_t kv_bytes = int64_t{2} * weights.config.layers * attn.n_kv_heads * attn.head_dim *
                             static_cast<int64_t>(sizeof(float));
    infer::Engine engine(*layout_, world, std::move(weights),
                         infer::EngineOptions{options_.model.decode_moe});
    set_matmul_min_rows(options_.batch_invariant ? kBatchInvariantRows : 0);
    const int dp_rank = engine.dp_rank();
    const bool samples = layout_->rank_info(world.rank()).tp_rank == 0;
    {
      std::lock_guard lock(board.mutex);
      ++board.loaded;
      board.kv_bytes_per_token = std::max(board.kv_bytes_per_token, kv_bytes);
    }
    board.changed.notify_all();

    std::unordered_map<int64_t, int> engine_id;  // scheduler slot -> this engine's sequence id
    std::vector<int64_t> expert_tokens_reported = engine.stats().expert_tokens;
    uint64_t seen = 0;
    for (;;) {
      const StepPlan* plan = nullptr;
      {
        std::unique_lock lock(board.mutex);
        board.changed.wait(lock,
                           [&] { return board.generation > seen || board.done || !board.failure.empty(); });
        if (board.done || !board.failure.empty()) return;
        seen = board.generation;
        plan = board.plan;
      }
      const ReplicaStep& mine = plan->replicas[static_cast<size_t>(dp_rank)];
      for (int64_t slot : mine.remove) {
        engine.remove_sequence(engine_id.at(slot));
        engine_id.erase(slot);
      }
      for (const auto& [slot, capacity] : mine.add) engine_id[slot] = engine.add_sequence(capacity);
      ReplicaTokens sampled;
      if (plan->runs_engine) {
        std::vector<int> ids;
        std::vector<std::vector<int32_t>> tokens;
        for (const SequenceStep& s : mine.sequences) {
          ids.push_back(engine_id.at(s.slot));
          tokens.push_back(s.tokens);
        }
        std::vector<int32_t> flat;
        if (!prefill_phase(*plan))
          for (const auto& t : tokens) flat.push_back(t.at(0));
        // One row of logits per sequence: its last new token's (the only one sampled from).
        const Tensor logits = prefill_phase(*plan)
                                  ? engine.prefill(ids, tokens, infer::PrefillLogits::LastRow)
                                  : engine.decode(ids, flat);
        if (samples) {
          const int64_t vocab = logits.dim(1);
          int64_t row = 0;
          for (const SequenceStep& s : mine.sequences) {
            if (!s.sample) {
              ++row;
              continue;
            }
            const float* p = logits.data<float>() + row++ * vocab;
            sampled.tokens.push_back(infer::sample_token(p, vocab, s.sampling, s.seed, s.index));
            if (s.trace_logits) sampled.logits_hashes.push_back(hash_floats(p, vocab));
          }
        }
      }
      if (plan->runs_engine) {  // this rank's routing load since the last step, for /metrics
        std::vector<int64_t> delta = engine.stats().expert_tokens;
        for (size_t e = 0; e < delta.size(); ++e) delta[e] -= expert_tokens_reported[e];
        expert_tokens_reported = engine.stats().expert_tokens;
        metrics_.expert_tokens(world.rank(), delta);
      }
      {
        std::lock_guard lock(board.mutex);
        if (samples) board.tokens[static_cast<size_t>(dp_rank)] = std::move(sampled);
        ++board.arrived;
      }
      board.changed.notify_all();
    }
  } catch (const std::exception& e) {
    board.fail(fmt::format("rank {}: {}", world.rank(), e.what()));
    throw;
  }
}

void Runtime::step_loop() {
  Board& board = *board_;
  while (std::optional<StepPlan> plan = scheduler_->next_step()) {
    {
      std::lock_guard lock(board.mutex);
      board.plan = &*plan;
      board.tokens.assign(static_cast<size_t>(layout_->dp()), {});
      board.arrived = 0;
      ++board.generation;
    }
    board.changed.notify_all();
    std::string failed;
    {
      std::unique_lock lock(board.mutex);
      board.changed.wait(lock, [&] { return board.arrived == board.world || !board.failure.empty(); });
      failed = board.failure;
    }
    if (!failed.empty()) {
      scheduler_->fail(failed);
      return;
    }
    scheduler_->complete_step(*plan, board.tokens);
  }
}

}  // namespace expar::serve
