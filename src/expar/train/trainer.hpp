#pragma once
// The training loop of `expar train`, run by every rank with its world Comm (threads or MPI).
//
// Layout: W ranks, context-parallel degree C, EP_MP degree M_E (TrainingLayout, seed 000 eq. 8 and
// Appendix F): D = W/C dense-DP ranks; the C ranks of a CP group hold chunks of the same sequences (rank c
// of the group positions [c·S/C, (c+1)·S/C) of each); dense parameters replicated over all W = D·C ranks,
// routed experts sharded over EP_MP and replicated over EP_DP, both folded over the D·C ranks (the MoE
// layer sees D·C token shards). Every dense-DP rank reads its own slice of each global batch (data.hpp), its
// CP ranks their chunks of it, runs `microbatches` forward/backward passes accumulating gradients (the loss
// is the mean over whole sequences: each chunk's loss gradient is divided by the tokens of the whole
// sequences), then the multi-group reducer sums dense gradients over the D·C ranks (DenseGrad) and expert
// gradients over EP_DP, and AdamW (warmup + cosine) updates.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/memory.hpp"
#include "expar/model/architecture.hpp"
#include "expar/model/model_config.hpp"
#include "expar/train/data.hpp"

namespace expar {

struct TrainConfig {
  ModelConfig model = ModelConfig::preset("demo");
  // How the run executes it (never saved with a checkpoint): the path (local needs M_E = 1), capacity,
  // payload precisions, the products' precision (bf16_products: the BF16 copies are refreshed from the f32
  // weights at the start and after every optimizer step), placement, waves, and activation recomputation
  // (recompute_every_moe: the same gradients with less resident memory — no expert activations kept, rowwise:
  // no dispatch lease per block and microbatch — for one more dispatch + expert forward + combine gather per
  // block in backward).
  ModelExecution execution = [] {
    ModelExecution e;
    e.moe.path = "rowwise";
    return e;
  }();
  // The model's Hugging Face family (ours: Expar) and what it adds to `model` (biases, q/k norms, windows,
  // rope scaling, a gated shared expert). With a family, checkpoints are saved in its Hugging Face layout
  // too, with `hf_config_json` as their config.json (train/checkpoint.hpp).
  ModelFormat format = ModelFormat::Expar;
  ModelFeatures features;
  std::string hf_config_json;
  // A Hugging Face checkpoint directory of `format` whose weights start the run (fine-tuning); empty: the
  // seeded random initialisation.
  std::string init_from;
  int ep = 1;  // M_E
  // Redundant expert slots (train/expert_replicas.hpp): S = E + R slots over the M_E ranks, M_E dividing S;
  // a replicated expert's gradient is summed over its replicas, so the run trains the same E experts.
  int redundant_experts = 0;
  // Every this many steps (0: never), re-place the experts by EPLB from the routes of the steps since the
  // last (train/expert_rebalance.hpp), moving weights and Adam moments: the same model, a new placement.
  int eplb_interval = 0;
  int cp = 1;  // C: context-parallel degree; divides the ranks and seq_len
  int steps = 300;
  int global_batch = 16;  // sequences per optimizer step, over all dense-DP ranks
  int seq_len = 128;
  int microbatches = 1;  // per rank and step
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  int warmup = 20;
  double weight_decay = 0.1;
  double clip_norm = 1.0;
  bool shard_optimizer = false;  // shard expert Adam state over EP_DP
  // Auxiliary-loss-free balancing (DeepSeek-V3, moe/score_bias.hpp): after every step each block's score
  // bias, added to the router's scores for selection only, moves by this rate times sign(mean − count) per
  // expert, the counts summed over every rank's microbatches. > 0 needs model.moe.use_score_bias (--score-
  // bias-rate sets both); 0 leaves a checkpoint's bias as it is.
  double score_bias_rate = 0;
  size_t bucket_bytes = size_t{4} << 20;
  uint64_t seed = 1234;
  int eval_every = 50;  // 0: only at the end
  int eval_sequences = 16;
  std::string checkpoint_dir;         // empty: no checkpoints; else a run directory of step-<N>/ saves
  int checkpoint_every = 0;           // 0: only at the end (when checkpoint_dir is set)
  int keep_last = 2;                  // step directories kept in checkpoint_dir (0: all)
  bool overwrite_checkpoint = false;  // replace a checkpoint of another model in checkpoint_dir
  // The dtype the saves hold the weights in (F32 or BF16); the training state saved for resume stays f32
  // (train/checkpoint.hpp).
  DType save_dtype = DType::F32;
  // A checkpoint (run directory or step directory) to resume from; its model config must equal `model`.
  std::string resume_from;
  int stop_after = -1;  // stop (as if interrupted) after this step; -1: run to `steps`
};

struct StepRecord {
  int step = 0;
  double loss = 0, aux_loss = 0, z_loss = 0, drop_rate = 0, utilisation = 0, grad_norm = 0, lr = 0;
  double tokens_per_second = 0;
  double val_loss = -1;  // -1 when not evaluated at this step
  // --eplb-interval, at a step that ended a window: the slots whose expert changed (0: EPLB kept the
  // placement; -1: no window ended), the bytes the EP_MP group moved, the ranks' load imbalance
  // (max - mean) / mean over the window under the old and the new placement, and the seconds it took.
  int eplb_slots_changed = -1;
  int64_t eplb_bytes_moved = 0;
  double eplb_imbalance_before = 0, eplb_imbalance_after = 0, eplb_seconds = 0;
};

// The rowwise path's shared lease pool after training (all zero without one): sized by the dry-run step,
// then frozen; each slot holds capacity_rows rows of the largest payload row (moe/paths/path.hpp).
struct LeasePoolSummary {
  bool present = false, frozen = false;
  int slots = 0, scratch_slots = 0, high_water = 0, leased_at_end = 0;
  int64_t capacity_rows = 0;  // max_capacity_rows of the largest forward under the capacity policy
  size_t slot_bytes = 0, resident_bytes = 0;
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  double final_val_loss = -1;
  MemorySnapshot memory;  // this rank's tracker at the end
  LeasePoolSummary leases;
};

// Called on rank 0 after every step (printing, logging); and once at start with the layout description.
struct TrainObserver {
  std::function<void(const std::string&)> on_start;
  std::function<void(const StepRecord&, const TrainConfig&)> on_step;
};

TrainSummary train(const TrainConfig& config, Comm& world, const TokenCorpus& corpus,
                   const TrainObserver* observer = nullptr);

}  // namespace expar
