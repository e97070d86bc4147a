#include "expar/serve/rank_loop.hpp"

#include <algorithm>
#include <unordered_map>

#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/timer.hpp"
#include "expar/infer/rank_memory_plan.hpp"
#include "expar/infer/sampling.hpp"
#include "expar/serve/runtime.hpp"

namespace expar::serve {
namespace {

// FNV-1a over the bytes of a logits row: equal hashes <=> (almost surely) bit-identical rows.
uint64_t hash_floats(const float* p, int64_t n) {
  uint64_t h = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(float)); ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  return h;
}

// The engine phase every rank runs `plan` in. With cross-DP EP the two phases sum a token's expert outputs
// in different orders (decode: over TP, then DP; prefill: over DP, then TP), so a decode token would change
// bits with the phase its neighbours put the step in. Batch invariance then runs every step as a prefill
// (same bytes moved: an all-gather and a reduce-scatter instead of an all-reduce over TP). Replicas that
// exchange no tokens (DP without cross-DP EP, or EP groups of one replica) sum over TP alone in both phases.
bool prefill_phase(const StepPlan& plan, bool batch_invariant, bool cross_dp_ep) {
  return plan.prefill || (batch_invariant && cross_dp_ep);
}

}  // namespace

int64_t largest_kv_bytes_per_token(const infer::ModelSpec& spec, const InferenceLayout& layout) {
  int64_t kv_bytes = 1;
  for (int r = 0; r < layout.world(); ++r)
    kv_bytes = std::max(kv_bytes, infer::kv_bytes_per_token(spec.config, spec.features, layout, r));
  return kv_bytes;
}

int64_t kv_tokens_per_rank(const RuntimeOptions& options, const infer::ModelSpec& spec,
                           const InferenceLayout& layout) {
  return options.kv_cache_mb * (int64_t{1} << 20) / largest_kv_bytes_per_token(spec, layout);
}

ServingModel open_serving_model(const RuntimeOptions& options, const Comm* mpi_world) {
  options.scheduler.validate();
  EXPAR_CHECK(options.kv_cache_mb >= 1 && options.kv_cache_mb <= (int64_t{1} << 30),
              "--kv-cache-mb {} must be in [1, 2^30]", options.kv_cache_mb);
  infer::ModelSpec spec = infer::open_model_spec(options.path, options.model.format);
  InferenceLayout layout = infer::inference_layout(options.model, spec.config);
  infer::check_decode_moe(layout, options.model.decode_moe);
  options.eplb.validate();
  EXPAR_CHECK(
      !options.eplb.rebalances() || layout.expert_parallel(),
      "--eplb-interval {} moves experts between the ranks of an EP group, but this layout has no expert "
      "parallelism: pass --enable-expert-parallel (with --redundant-experts R for replicas of hot "
      "experts), or drop --eplb-interval",
      options.eplb.interval);
  infer::FitRequest fit;
  fit.spec = &spec;
  fit.options = options.model;
  if (mpi_world) fit.hosted_ranks = {mpi_world->rank()};
  const int64_t kv_bytes = largest_kv_bytes_per_token(spec, layout);
  fit.kv_tokens = kv_tokens_per_rank(options, spec, layout);
  fit.kv_fix = [kv_bytes](int64_t positions) -> std::optional<std::string> {
    const int64_t mb = positions * kv_bytes >> 20;
    if (mb < 1) return std::nullopt;
    return "--kv-cache-mb " + std::to_string(mb);
  };
  infer::check_fits_before_loading(fit);
  return {std::move(spec), std::move(layout)};
}

void run_serving_rank(const RuntimeOptions& options, const ServingModel& model, Comm& world,
                      StepChannel& channel) {
  const InferenceLayout& layout = model.layout;
  std::unique_ptr<TensorStore> store = infer::open_store(model.spec);
  infer::RankWeights weights =
      infer::load_rank_weights(*store, model.spec, layout, world.rank(), options.model.weight_dtype);
  store.reset();
  const int64_t kv_bytes =
      infer::kv_bytes_per_token(model.spec.config, model.spec.features, layout, world.rank());
  infer::Engine engine(layout, world, std::move(weights), infer::engine_options_for(options.model));
  set_matmul_min_rows(options.batch_invariant ? batch_invariant_rows() : 0);
  const int dp_rank = engine.dp_rank();
  const bool samples = layout.rank_info(world.rank()).tp_rank == 0;
  channel.loaded(kv_bytes);

  std::unordered_map<int64_t, int> engine_id;  // scheduler slot -> this engine's sequence id
  std::vector<std::vector<int64_t>> expert_tokens_reported = engine.stats().layer_expert_tokens;
  std::vector<int64_t> layer_rows_reported = engine.stats().layer_rows;
  while (const StepPlan* plan = channel.next()) {
    RankResult result;
    if (!plan->expert_tables.empty()) {
      // Between steps: no sequence is in flight inside the engine, and the KV caches do not depend on
      // where the experts are.
      Timer timer;
      result.moved_bytes = engine.move_experts(plan->expert_tables);
      result.move_seconds = timer.seconds();
    }
    const ReplicaStep& mine = plan->replicas[static_cast<size_t>(dp_rank)];
    for (int64_t slot : mine.remove) {
      engine.remove_sequence(engine_id.at(slot));
      engine_id.erase(slot);
    }
    for (const auto& [slot, capacity] : mine.add) engine_id[slot] = engine.add_sequence(capacity);
    result.dp_rank = dp_rank;
    result.samples = samples;
    if (plan->runs_engine) {
      std::vector<int> ids;
      std::vector<std::vector<int32_t>> tokens;
      for (const SequenceStep& s : mine.sequences) {
        ids.push_back(engine_id.at(s.slot));
        tokens.push_back(s.tokens);
      }
      const bool prefill = prefill_phase(*plan, options.batch_invariant, layout.cross_dp_ep());
      std::vector<int32_t> flat;
      if (!prefill)
        for (const auto& t : tokens) flat.push_back(t.at(0));
      // One row of logits per sequence: its last new token's (the only one sampled from).
      const Tensor logits =
          prefill ? engine.prefill(ids, tokens, infer::PrefillLogits::LastRow) : engine.decode(ids, flat);
      if (samples) {
        const int64_t vocab = logits.dim(1);
        int64_t row = 0;
        for (const SequenceStep& s : mine.sequences) {
          if (!s.sample) {
            ++row;
            continue;
          }
          const float* p = logits.data<float>() + row++ * vocab;
          result.tokens.tokens.push_back(infer::sample_token(p, vocab, s.sampling, s.seed, s.index));
          if (s.trace_logits) result.tokens.logits_hashes.push_back(hash_floats(p, vocab));
        }
      }
      // This rank's routing load since the last step, for /metrics.
      result.layer_expert_tokens = engine.stats().layer_expert_tokens;
      for (size_t l = 0; l < result.layer_expert_tokens.size(); ++l)
        for (size_t e = 0; e < result.layer_expert_tokens[l].size(); ++e)
          result.layer_expert_tokens[l][e] -= expert_tokens_reported[l][e];
      expert_tokens_reported = engine.stats().layer_expert_tokens;
      result.layer_rows = engine.stats().layer_rows;
      for (size_t l = 0; l < result.layer_rows.size(); ++l) result.layer_rows[l] -= layer_rows_reported[l];
      layer_rows_reported = engine.stats().layer_rows;
    }
    channel.finished(std::move(result));
  }
}

}  // namespace expar::serve
