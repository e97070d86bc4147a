#include "expar/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/timer.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/moe/score_bias.hpp"
#include "expar/topo/training_layout.hpp"
#include "expar/train/adamw.hpp"
#include "expar/train/checkpoint.hpp"
#include "expar/train/expert_rebalance.hpp"
#include "expar/train/expert_replicas.hpp"
#include "expar/train/grad_reducer.hpp"
#include "expar/train/lr_schedule.hpp"
#include "expar/train/plan_activations.hpp"

namespace expar {

namespace {

// `latent`: the model's attention is latent (its CP groups gather the compressed latent rows).
std::string describe_layout(const TrainingLayout& layout, const ExpertPlacement& placement, bool latent) {
  std::string out =
      fmt::format("layout: W={} ranks, D={} dense-DP, C={} CP, M_E={} (EP_MP), D_E={} (EP_DP)\n",
                  layout.world, layout.dp, layout.cp, layout.ep_mp, layout.ep_dp);
  auto list = [](const std::vector<std::vector<int>>& groups) {
    std::string s;
    for (const auto& g : groups) s += fmt::format("{{{}}} ", fmt::join(g, ","));
    return s;
  };
  out += "  EP_MP groups (exchange token rows): " + list(layout.groups(TrainingGroup::EpMp)) + "\n";
  out += "  EP_DP groups (reduce expert gradients): " + list(layout.groups(TrainingGroup::EpDp)) + "\n";
  if (layout.cp > 1) {
    out += fmt::format("  CP groups (chunks of the same sequences; gather {}): ",
                       latent ? "the latent rows" : "keys and values") +
           list(layout.groups(TrainingGroup::Cp)) + "\n";
    out += "  dense DP groups (read the same chunk of different sequences): " +
           list(layout.groups(TrainingGroup::Dp)) + "\n";
    out += "  DenseGrad group (reduce dense gradients over D*C): " +
           list(layout.groups(TrainingGroup::DenseGrad)) + "\n";
  } else {
    out += "  dense DP group (reduce dense gradients): " + list(layout.groups(TrainingGroup::Dp)) + "\n";
  }
  if (placement.has_replicas()) {
    std::vector<std::string> replicated;
    for (int e = 0; e < placement.num_experts(); ++e)
      if (placement.replica_count(e) > 1)
        replicated.push_back(fmt::format("{} (slots {})", e, fmt::join(placement.expert_slots(e), ",")));
    out += fmt::format("  {} expert slots for {} experts, replicated: {}\n", placement.num_slots(),
                       placement.num_experts(), fmt::join(replicated, ", "));
  }
  for (int r = 0; r < layout.world; ++r) {
    const TrainingCoords c = layout.coords(r);
    auto experts = placement.local_experts(c.ep_mp);
    out += fmt::format(
        "  rank {}: {}(EP_DP {}, EP_MP {}) experts {}\n", r,
        layout.cp > 1 ? fmt::format("(DP {}, CP {}) ", c.dp, c.cp) : std::string(), c.ep_dp, c.ep_mp,
        experts.size() > 1 && experts.back() - experts.front() + 1 == static_cast<int>(experts.size())
            ? fmt::format("{}-{}", experts.front(), experts.back())
            : fmt::format("{}", fmt::join(experts, ",")));
  }
  return out;
}

// Every rank's current bytes per category, gathered to all, as a table (rank x category).
std::string memory_table(Comm& world) {
  MemorySnapshot mine = current_tracker().snapshot();
  std::vector<int64_t> all(static_cast<size_t>(world.size()) * kNumMemCategories);
  world.all_gather(mine.current.data(), all.data(), kNumMemCategories, DType::I64);
  std::string out = fmt::format("per-rank memory at start:\n{:<6}", "rank");
  std::vector<size_t> used;
  for (size_t c = 0; c < kNumMemCategories; ++c) {
    bool any = false;
    for (int r = 0; r < world.size(); ++r) any |= all[static_cast<size_t>(r) * kNumMemCategories + c] != 0;
    if (!any) continue;
    used.push_back(c);
    out += fmt::format("{:>23}", mem_category_name(static_cast<MemCategory>(c)));
  }
  out += fmt::format("{:>14}\n", "total");
  for (int r = 0; r < world.size(); ++r) {
    out += fmt::format("{:<6}", r);
    int64_t total = 0;
    for (size_t c : used) {
      int64_t b = all[static_cast<size_t>(r) * kNumMemCategories + c];
      total += b;
      out += fmt::format("{:>23}", format_bytes(b));
    }
    out += fmt::format("{:>14}\n", format_bytes(total));
  }
  return out;
}

// How the lease pool's slots (rowwise, aggregated: PathTraits::shared_heap) are sized: allocated by the
// dry-run step, not yet in the table above.
std::string lease_pool_sizing(const TrainConfig& cfg, const TrainingLayout& layout, int64_t rows,
                              int64_t tokens, size_t slot_bytes) {
  const int64_t m = layout.ep_mp, k = cfg.model.moe.router.top_k,
                e_local = (cfg.model.moe.router.num_experts + cfg.redundant_experts) / layout.ep_mp;
  const CapacityPolicy& p = cfg.execution.moe.capacity;
  const std::string rule =
      p.rule == CapacityRule::Dropless
          ? fmt::format("dropless: the bound M_E*T*min(K, E_L) = {}*{}*{}", m, tokens, std::min(k, e_local))
          : fmt::format("capacity policy {} cf={} for T={} tokens per rank (dropless bound {})",
                        capacity_rule_name(p.rule), p.capacity_factor, tokens,
                        m * tokens * std::min(k, e_local));
  return fmt::format(
      "symmetric buffers ({} lease pool, allocated by the dry-run step, then frozen): each slot {} = {} "
      "rows ({}) x {} bytes per row\n",
      cfg.execution.moe.path, format_bytes(static_cast<int64_t>(slot_bytes)), rows, rule,
      rows > 0 ? slot_bytes / static_cast<size_t>(rows) : 0);
}

// What a microbatch's forward saves for its backward, as `expar plan` counts it (train/plan_activations):
// live on top of the table above from each forward to its backward.
std::string saved_activations_line(const SavedActivations& a) {
  return fmt::format(
      "activations saved per microbatch (the most a rank holds: the experts' rows at the capacity, {} per "
      "MoE "
      "layer): {} = attention {} + residuals {} + router {} + experts {} + shared/dense MLPs {} + head and "
      "loss gradient {}\n",
      a.expert_rows, format_bytes(a.total()), format_bytes(a.attention), format_bytes(a.residuals),
      format_bytes(a.router), format_bytes(a.experts), format_bytes(a.mlps), format_bytes(a.head));
}

// The communicators of a run's groups (TrainingLayout's rank order).
struct RunGroups {
  TrainingLayout layout;
  std::shared_ptr<Comm> dp, cp, dense_grad, ep_mp, ep_dp;
};

RunGroups make_groups(const TrainConfig& cfg, Comm& world) {
  // With the model's expert count, so that a refused M_E or C is answered with values that the placement
  // accepts too (the MoE layers' own check knows no D*C).
  TrainingLayoutConfig lc{world.size(), cfg.ep, cfg.cp};
  lc.num_experts = cfg.model.moe.router.num_experts + cfg.redundant_experts;  // slots: M_E divides them
  const TrainingLayout layout(lc);
  RunGroups g{layout,
              world.subgroup(layout.groups(TrainingGroup::Dp), "dp"),
              world.subgroup(layout.groups(TrainingGroup::Cp), "cp"),
              world.subgroup(layout.groups(TrainingGroup::DenseGrad), "dense_grad"),
              world.subgroup(layout.groups(TrainingGroup::EpMp), "ep_mp"),
              world.subgroup(layout.groups(TrainingGroup::EpDp), "ep_dp")};
  return g;
}

// This rank's part of a batch of whole sequences: all of them, or its CP chunk of each.
TokenBatch own_part(TokenBatch batch, const RunGroups& g) {
  return g.layout.cp > 1 ? sequence_chunk(batch, g.cp->rank(), g.layout.cp) : batch;
}

double validation_loss(MoeTransformer& model, const TokenCorpus& corpus, const TrainConfig& cfg,
                       const RunGroups& g) {
  // Sequences are split over the dense-DP ranks (each CP rank takes its chunk of its DP rank's); every rank
  // of an EP group must run the same number of forwards (the MoE layer is collective), which holds because
  // all ranks take the same count. Every chunk holds as many tokens, so the mean of the ranks' means over
  // the D*C ranks is the mean over all tokens.
  const int dp = g.layout.dp, per_rank = std::max(1, cfg.eval_sequences / dp);
  TokenBatch b =
      own_part(validation_batch(corpus, per_rank * dp, g.dp->rank() * per_rank, per_rank, cfg.seq_len), g);
  double loss = model.evaluate(b.inputs, b.targets, per_rank, b.seq_len).loss;
  g.dense_grad->all_reduce(&loss, 1, DType::F64, ReduceOp::Sum);
  return loss / g.dense_grad->size();
}

// Every value the loop divides by, multiplies or descends along: a bad one is an error naming the option,
// never a SIGFPE or a run that silently trains uphill.
void check_train_config(const TrainConfig& c) {
  auto positive_int = [](int v, const char* name) {
    EXPAR_CHECK(v >= 1, "{}={} must be at least 1", name, v);
  };
  positive_int(c.steps, "steps (--steps)");
  positive_int(c.global_batch, "global batch (--batch)");
  positive_int(c.seq_len, "sequence length (--seq-len)");
  positive_int(c.microbatches, "microbatches (--microbatches)");
  positive_int(c.eval_sequences, "eval_sequences");
  EXPAR_CHECK(c.seq_len <= c.model.max_seq, "sequence length (--seq-len) {} exceeds the model's max_seq {}",
              c.seq_len, c.model.max_seq);
  auto non_negative = [](double v, const char* name) {
    EXPAR_CHECK(std::isfinite(v) && v >= 0, "{}={} must be a finite number >= 0", name, v);
  };
  EXPAR_CHECK(std::isfinite(c.lr) && c.lr > 0, "learning rate (--lr) {} must be a finite number > 0", c.lr);
  non_negative(c.weight_decay, "weight decay (--weight-decay)");
  non_negative(c.clip_norm, "gradient clip norm (--clip; 0: off)");
  non_negative(c.min_lr_ratio, "min_lr_ratio");
  non_negative(c.model.moe.router.aux_loss_coef, "aux loss coefficient (--aux-coef)");
  non_negative(c.model.moe.router.z_loss_coef, "z loss coefficient (--z-coef)");
  non_negative(c.score_bias_rate, "score bias update rate (--score-bias-rate)");
  EXPAR_CHECK(
      c.score_bias_rate == 0 || c.model.moe.use_score_bias,
      "--score-bias-rate {} needs a model with a score bias (ModelConfig moe.use_score_bias); a checkpoint "
      "trained without one cannot gain one on resume: start a new run",
      c.score_bias_rate);
  // Ours and DeepSeek-V3 (mlp.gate.e_score_correction_bias) hold a score bias in their checkpoints.
  EXPAR_CHECK(
      !c.model.moe.use_score_bias || c.format == ModelFormat::Expar || c.format == ModelFormat::DeepseekV3,
      "a score bias (--score-bias-rate) is not part of the {} architecture, so its checkpoints could not "
      "hold it: train it in expar's own format (no --model), or drop --score-bias-rate",
      model_format_name(c.format));
  if (c.execution.bf16_products) check_bf16_native("expar train --precision bf16");
  for (auto [v, name] : {std::pair{c.warmup, "warmup steps (--warmup)"},
                         {c.eval_every, "--eval-every"},
                         {c.checkpoint_every, "--checkpoint-every"},
                         {c.keep_last, "--keep-last"}})
    EXPAR_CHECK(v >= 0, "{}={} must not be negative", name, v);
}

// Whether the run has a load-balancing loss over batches of sequences (not DeepSeek's sequence-wise one,
// whose batches are the sequences whatever the layout).
bool batch_aux_loss(const TrainConfig& cfg) {
  const RouterConfig& r = cfg.model.moe.router;
  return r.aux_loss_coef != 0.0 && r.aux_loss_kind == AuxLossKind::Batch;
}

// The trainer's rules over the layout and the split of the batch, as one validation: the training layout
// with the model's experts, whole sequences per dense-DP rank and microbatch, whole chunks per CP rank and,
// with the load-balancing loss under CP, whole microbatches of a C = 1 run (router_loss_batches). The
// values a refusal below suggests are found by running it over candidates, so each is accepted.
bool split_accepted(const TrainConfig& cfg, int world, int cp, int batch, int seq_len) {
  TrainingLayoutConfig lc{world, cfg.ep, cp};
  lc.num_experts = cfg.model.moe.router.num_experts;
  if (training_layout_refusal(lc)) return false;
  const int dp = world / cp;
  if (batch % (dp * cfg.microbatches) != 0 || seq_len % cp != 0) return false;
  return batch / dp / cfg.microbatches % cp == 0 || !batch_aux_loss(cfg);
}

// The smallest global batch the split accepts; the accepted ones are its multiples. W*microbatches is
// always accepted once the layout is (one sequence per rank and microbatch, C per CP group).
int smallest_batch(const TrainConfig& cfg, const TrainingLayout& layout) {
  int b = 1;
  while (!split_accepted(cfg, layout.world, layout.cp, b, cfg.seq_len)) ++b;
  return b;
}

// The batch and sequence split the layout needs: whole sequences per dense-DP rank and microbatch, whole
// chunks per CP rank.
void check_layout_split(const TrainConfig& cfg, const TrainingLayout& layout) {
  const int w = layout.world;
  EXPAR_CHECK(
      cfg.global_batch % (layout.dp * cfg.microbatches) == 0,
      "global batch {} is not divisible by dense-DP ranks {} x microbatches {}: choose a multiple of {}",
      cfg.global_batch, layout.dp, cfg.microbatches, smallest_batch(cfg, layout));
  if (cfg.seq_len % cfg.cp == 0) return;
  std::vector<std::string> fixes;
  // A multiple of C up to the model's max_seq (check_train_config), the nearest first.
  const int longer = (cfg.seq_len / cfg.cp + 1) * cfg.cp;
  const int shorter = cfg.seq_len / cfg.cp * cfg.cp;
  if ((longer <= cfg.model.max_seq && split_accepted(cfg, w, cfg.cp, cfg.global_batch, longer)) ||
      (shorter >= 1 && split_accepted(cfg, w, cfg.cp, cfg.global_batch, shorter)))
    fixes.push_back(
        fmt::format("choose --seq-len a multiple of {} (up to max_seq {})", cfg.cp, cfg.model.max_seq));
  std::vector<int> cps;
  for (int c = 1; c <= w; ++c)
    if (split_accepted(cfg, w, c, cfg.global_batch, cfg.seq_len)) cps.push_back(c);
  if (cps.size() == 1) fixes.push_back(fmt::format("set --cp {}", cps[0]));
  if (cps.size() > 1) fixes.push_back(fmt::format("choose --cp in {{{}}}", fmt::join(cps, ",")));
  if (fixes.empty()) {
    // Neither alone: C = 1 (always a layout the ranks accept) with a batch it splits.
    int b = 1;
    while (!split_accepted(cfg, w, 1, b, cfg.seq_len)) ++b;
    fixes.push_back(fmt::format("set --cp 1 and choose --batch a multiple of {}", b));
  }
  fail(
      "sequence length (--seq-len) {} is not divisible by the context-parallel degree C={} (--cp): each of "
      "the "
      "C ranks of a CP group holds S/C positions of every sequence; {}",
      cfg.seq_len, cfg.cp, fmt::join(fixes, ", or "));
}

// The loss batches of the routers under CP (MoeTransformer::set_context_parallel). At C = 1 the aux and
// z losses are over each rank's microbatch, B/(W·M) sequences; a CP group's microbatch holds C of those
// (D = W/C), so C loss batches make the losses and their gradients those of C = 1 on the same W ranks.
// Without such a C = 1 run (C not dividing the group's microbatch) the load-balancing loss has no
// C = 1 value to keep and is refused; the z-loss alone is a mean over tokens, equal over one batch.
int router_loss_batches(const TrainConfig& cfg, const TrainingLayout& layout) {
  const int mb_seqs = cfg.global_batch / layout.dp / cfg.microbatches;
  if (mb_seqs % layout.cp == 0) return layout.cp;
  EXPAR_CHECK(
      !batch_aux_loss(cfg),
      "global batch {} is not divisible by ranks {} x microbatches {}: with --cp {} the load-balancing "
      "loss (--aux-coef {}) is over the sequences one rank of a --cp 1 run on the same ranks routes per "
      "microbatch, which must be whole; choose --batch a multiple of {}, or --aux-coef 0",
      cfg.global_batch, layout.world, cfg.microbatches, layout.cp, cfg.model.moe.router.aux_loss_coef,
      layout.world * cfg.microbatches);
  return 1;
}

// Found before any work: a checkpoint target that cannot be written or holds another model, a resume
// checkpoint of another model or with nothing left to train. Returns the first step to run.
int first_step(const TrainConfig& cfg, int last) {
  if (!cfg.checkpoint_dir.empty())
    check_checkpoint_target(cfg.checkpoint_dir, cfg.model, cfg.overwrite_checkpoint);
  if (cfg.resume_from.empty()) return 0;
  const CheckpointInfo info = read_checkpoint_info(cfg.resume_from);
  EXPAR_CHECK(info.format == cfg.format,
              "--resume '{}' holds a {} model but this run trains a {} model: resume with the checkpoint's "
              "--model",
              cfg.resume_from, model_format_name(info.format), model_format_name(cfg.format));
  const std::string difference = model_config_difference(cfg.model, info.model);
  EXPAR_CHECK(difference.empty(),
              "--resume '{}': {}: a run resumes with the checkpoint's model config; drop the option that "
              "contradicts it",
              cfg.resume_from, difference);
  EXPAR_CHECK(info.step < last,
              "--resume '{}': the checkpoint has completed step {} of a run of {} steps: nothing is left to "
              "train; pass --steps greater than {}",
              cfg.resume_from, info.step, last, info.step);
  return static_cast<int>(info.step);
}

// The model config the run trains: the router coefficients per forward.
ModelConfig run_model_config(const TrainConfig& cfg) {
  ModelConfig mc = cfg.model;
  // The router adds coef·grad(L) per forward, L over the forward's tokens: a microbatch's sequences (under
  // CP, router_loss_batches). With accumulation the step averages over microbatches, as the loss gradient
  // does; each microbatch's load-balancing loss is its own (a product of its statistics, not additive).
  mc.moe.router.aux_loss_coef /= cfg.microbatches;
  mc.moe.router.z_loss_coef /= cfg.microbatches;
  return mc;
}

// The forward/backward passes of one step on this rank (gradients accumulate in the model); the record's
// losses are this rank's means over its tokens.
// `expert_counts` ([layers x E]) gets this rank's routes per block and expert, summed over the microbatches.
StepRecord run_microbatches(MoeTransformer& model, const TrainConfig& cfg, const TokenCorpus& corpus,
                            const RunGroups& g, int step, std::vector<int64_t>& expert_counts) {
  const int local_seqs = cfg.global_batch / g.layout.dp, mb_seqs = local_seqs / cfg.microbatches;
  StepRecord rec;
  rec.step = step;
  for (int mb = 0; mb < cfg.microbatches; ++mb) {
    TokenBatch batch =
        own_part(training_batch(corpus, cfg.seed, step, cfg.global_batch,
                                g.dp->rank() * local_seqs + mb * mb_seqs, mb_seqs, cfg.seq_len),
                 g);
    model.set_microbatch(mb);  // lease tags name the real microbatch
    // The loss is the mean over the whole sequences of the step: the normaliser counts every chunk's tokens.
    StepMetrics m = model.forward_backward(batch.inputs, batch.targets, mb_seqs, batch.seq_len,
                                           static_cast<int64_t>(local_seqs) * cfg.seq_len);
    rec.loss += m.loss / cfg.microbatches;
    rec.aux_loss += m.aux_loss / cfg.microbatches;
    rec.z_loss += m.z_loss / cfg.microbatches;
    rec.drop_rate += m.drop_rate / cfg.microbatches;
    rec.utilisation = std::max(rec.utilisation, m.utilisation);
    if (expert_counts.empty()) expert_counts.assign(m.expert_counts.size(), 0);
    EXPAR_ASSERT(expert_counts.size() == m.expert_counts.size(), "microbatch {} counted {} routes, not {}",
                 mb, m.expert_counts.size(), expert_counts.size());
    for (size_t i = 0; i < expert_counts.size(); ++i) expert_counts[i] += m.expert_counts[i];
  }
  return rec;
}

// Auxiliary-loss-free balancing after a step: every block's score bias from the step's routes per expert,
// summed over every rank (each holds the routers; TP peers count the same tokens alike, which the sign
// ignores), in the same order everywhere, so every rank keeps the same bias.
void update_score_biases(MoeTransformer& model, std::vector<int64_t>& counts, double rate, Comm& world) {
  world.all_reduce(counts.data(), counts.size(), DType::I64, ReduceOp::Sum);
  const int e = model.config().moe.router.num_experts;
  EXPAR_ASSERT(counts.size() == static_cast<size_t>(model.config().layers) * static_cast<size_t>(e),
               "{} route counts for {} blocks of {} experts", counts.size(), model.config().layers, e);
  for (int l = 0; l < model.config().layers; ++l)
    if (model.has_moe(l))  // a dense MLP layer has no router (its counts are zero)
      update_score_bias(
          model.moe(l).params().score_bias.span<float>(),
          std::span<const int64_t>(counts).subspan(static_cast<size_t>(l) * e, static_cast<size_t>(e)),
          static_cast<float>(rate));
}

// The step's losses as means over every rank (each holds as many tokens), the utilisation as the maximum.
void average_over_ranks(StepRecord& rec, Comm& world) {
  double sums[4] = {rec.loss, rec.aux_loss, rec.z_loss, rec.drop_rate};
  world.all_reduce(sums, 4, DType::F64, ReduceOp::Sum);
  world.all_reduce(&rec.utilisation, 1, DType::F64, ReduceOp::Max);
  rec.loss = sums[0] / world.size();
  rec.aux_loss = sums[1] / world.size();
  rec.z_loss = sums[2] / world.size();
  rec.drop_rate = sums[3] / world.size();
}

LeasePoolSummary lease_summary(const MoeTransformer& model, int64_t pool_rows) {
  LeasePoolSummary l;
  const LeasePool* pool = model.lease_pool();
  if (pool == nullptr) return l;
  l.present = true;
  l.frozen = pool->frozen();
  l.slots = pool->slot_count();
  l.scratch_slots = pool->scratch_count();
  l.high_water = pool->high_water();
  l.leased_at_end = pool->leased_count();
  l.capacity_rows = pool_rows;
  l.slot_bytes = pool->slot_bytes();
  l.resident_bytes = pool->resident_bytes();
  return l;
}

}  // namespace

TrainSummary train(const TrainConfig& cfg, Comm& world, const TokenCorpus& corpus,
                   const TrainObserver* observer) {
  check_train_config(cfg);
  check_redundant_experts(cfg.model.moe.router.num_experts, cfg.redundant_experts, cfg.ep, world.size(),
                          cfg.cp);
  EXPAR_CHECK(cfg.eplb_interval >= 0, "--eplb-interval {} must not be negative (0: never re-place)",
              cfg.eplb_interval);
  EXPAR_CHECK(
      cfg.eplb_interval == 0 || !cfg.shard_optimizer,
      "--eplb-interval {} moves each expert's Adam moments whole, which --shard-optimizer splits over "
      "EP_DP: drop --shard-optimizer or --eplb-interval",
      cfg.eplb_interval);
  const RunGroups g = make_groups(cfg, world);
  const TrainingLayout& layout = g.layout;
  check_layout_split(cfg, layout);
  const int loss_batches = router_loss_batches(cfg, layout);
  const int last = cfg.stop_after >= 0 ? std::min(cfg.steps, cfg.stop_after) : cfg.steps;
  EXPAR_CHECK(cfg.format == ModelFormat::Expar || !cfg.hf_config_json.empty(),
              "a {} model needs the config.json its checkpoints are saved with (TrainConfig::hf_config_json)",
              model_format_name(cfg.format));
  const int start = first_step(cfg, last);

  const ModelConfig mc = run_model_config(cfg);
  // The shared lease pool's slots must hold the largest forward this run makes: a training microbatch or the
  // validation batch (validation_loss gives each rank max(1, eval_sequences / D) sequences), of chunks.
  const int mb_seqs = cfg.global_batch / layout.dp / cfg.microbatches;
  const int eval_seqs = std::max(1, cfg.eval_sequences / layout.dp);
  const int64_t max_forward_tokens =
      static_cast<int64_t>(std::max(mb_seqs, eval_seqs)) * (cfg.seq_len / cfg.cp);
  ModelExecution execution = cfg.execution;
  if (cfg.redundant_experts > 0) {
    EXPAR_CHECK(execution.moe.slots.empty(),
                "--redundant-experts {} and an explicit slot table (MoeExecution::slots) both place the "
                "experts: give one",
                cfg.redundant_experts);
    execution.moe.slots =
        training_expert_slots(mc.moe.router.num_experts, cfg.redundant_experts, layout.ep_mp);
  }
  MoeTransformer model(mc, execution, *g.ep_mp, max_forward_tokens, cfg.features);
  if (layout.cp > 1) model.set_context_parallel(g.cp.get(), loss_batches);
  // The slot rows the pool is sized by, stated in the start-up table (dropless: the bound).
  const int64_t pool_rows = max_capacity_rows(max_forward_tokens, mc.moe.router.top_k,
                                              model.first_moe().placement(), cfg.execution.moe.capacity);
  model.init(cfg.seed);
  if (!cfg.init_from.empty() && cfg.resume_from.empty()) load_hf_weights(cfg.init_from, cfg.format, model);

  std::vector<Parameter*> params;
  for (Parameter& p : model.parameters()) params.push_back(&p);
  GradReducer reducer(params, *g.dense_grad, *g.ep_dp, cfg.bucket_bytes, layout.dp);
  AdamWConfig acfg;
  acfg.weight_decay = cfg.weight_decay;
  acfg.clip_norm = cfg.clip_norm;
  acfg.shard_expert_state = cfg.shard_optimizer;
  AdamW optimizer(params, acfg, *g.ep_mp, *g.ep_dp);
  LrSchedule schedule{cfg.lr, cfg.min_lr_ratio, cfg.warmup, cfg.steps};

  if (!cfg.resume_from.empty()) load_checkpoint(cfg.resume_from, model, &optimizer);
  model.refresh_bf16_copies();  // from the weights the run starts with (no-op in f32)
  std::string memory = memory_table(world);
  if (model.lease_pool() != nullptr)
    memory += lease_pool_sizing(cfg, layout, pool_rows, max_forward_tokens, model.lease_pool()->slot_bytes());
  memory += saved_activations_line(model_saved_activations(
      model, static_cast<int64_t>(mb_seqs) * (cfg.seq_len / layout.cp), cfg.seq_len, layout.cp));
  if (observer && observer->on_start && world.rank() == 0)
    observer->on_start(
        describe_layout(layout, model.first_moe().placement(), model.features().mla.enabled()) + memory);

  bool saved = false;
  auto save = [&](int steps_done) {
    CheckpointInfo info{steps_done,   cfg.seed,   cfg.model,          cfg.ep,
                        world.size(), cfg.format, cfg.hf_config_json, cfg.save_dtype};
    // With --overwrite, the first save of this run replaces every step directory already there.
    CheckpointSaveOptions options{cfg.keep_last, cfg.overwrite_checkpoint && !saved};
    save_checkpoint(cfg.checkpoint_dir, info, model, &optimizer, world, *g.ep_mp, *g.ep_dp, options);
    saved = true;
  };

  TrainSummary summary;
  ExpertRebalancer rebalancer(cfg.eplb_interval);
  for (int step = start; step < last; ++step) {
    Timer timer;
    model.zero_grads();
    std::vector<int64_t> expert_counts;
    StepRecord rec = run_microbatches(model, cfg, corpus, g, step, expert_counts);
    // The first step is the dry run that sizes the shared lease pool; after it the pool is frozen.
    if (step == start) model.freeze_leases();
    reducer.reduce();
    sum_replica_gradients(params, model.first_moe().placement(), *g.ep_mp);
    rec.lr = schedule.at(step);
    rec.grad_norm = optimizer.step(rec.lr);
    rebalancer.count(expert_counts);  // before the score bias sums them over the ranks
    if (cfg.score_bias_rate > 0) update_score_biases(model, expert_counts, cfg.score_bias_rate, world);
    if (rebalancer.window_ends(step, last)) {
      const ExpertMove move = rebalancer.rebalance(model, optimizer, *g.ep_mp, world);
      rec.eplb_slots_changed = move.slots_changed;
      rec.eplb_bytes_moved = move.bytes_sent;
      rec.eplb_imbalance_before = move.imbalance_before;
      rec.eplb_imbalance_after = move.imbalance_after;
      rec.eplb_seconds = move.seconds;
      model.refresh_bf16_copies();  // the moved experts' copies (the optimizer refreshed the others)
    }
    average_over_ranks(rec, world);
    rec.tokens_per_second = static_cast<double>(cfg.global_batch) * cfg.seq_len / timer.seconds();
    const bool last_step = step + 1 == last;
    if ((cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0) || last_step) {
      model.set_microbatch(-1);
      rec.val_loss = validation_loss(model, corpus, cfg, g);
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) || last_step))
      save(step + 1);
    summary.steps.push_back(rec);
    if (observer && observer->on_step && world.rank() == 0) observer->on_step(rec, cfg);
  }
  if (!summary.steps.empty()) summary.final_val_loss = summary.steps.back().val_loss;
  summary.memory = current_tracker().snapshot();
  summary.leases = lease_summary(model, pool_rows);
  return summary;
}

}  // namespace expar
