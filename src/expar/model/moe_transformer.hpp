#pragma once
// The MoE transformer: token embedding; L blocks of [RMSNorm -> causal multi-head self-attention with RoPE
// -> residual; RMSNorm -> MoE MLP (router + routed experts over the EP group, optional shared expert) ->
// residual]; final RMSNorm; LM head. Explicit forward and backward over saved per-block state.
//
// The Hugging Face families add (model/architecture.hpp's ModelFeatures, trained with their gradients): q/k/v
// and o biases, q/k RMSNorm (per head or over the projection), attention sinks, sliding windows per layer,
// rope scaling, a shared expert scaled by sigmoid(x · gate), gpt-oss's router bias and experts (biases,
// clamped SwiGLU: the MoE layer's), and tied embeddings (one parameter for the embedding and the LM head).
//
// DeepSeek-V2/V3 (features.mla enabled): multi-head latent attention (nn/latent_attention.hpp) in place of
// the q/k/v projections, parameters "layers.L.attn.{wq | wq_a, q_a_norm, wq_b}, wkv_a, kv_a_norm, wkv_b, wo",
// the rope on adjacent pairs when rope_interleave. Dense MLP layers (features.is_dense_mlp: DeepSeek's first
// layers, Qwen-MoE's mlp_only_layers): a SwiGLU MLP "layers.L.mlp.w1|w3|w2" on moe/expert_mlp in place of
// the block's MoE MLP (and its shared expert); such a block has no MoeLayer (has_moe(l) is false).
//
// Parameters are named ("layers.3.attn.wq", "layers.3.moe.experts.w1" for the local expert shard) and
// initialised from (seed, name, element) only, so every layout starts from the same weights: routed expert
// e has the same values whatever the EP degree (the MoE layer draws one stream per (layer, expert)).
#include <memory>
#include <string>
#include <vector>

#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/parameter.hpp"
#include "expar/model/architecture.hpp"
#include "expar/model/model_config.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/rope.hpp"

namespace expar {

class Comm;

struct StepMetrics {
  double loss = 0.0;         // cross-entropy of this microbatch, mean over its tokens
  double aux_loss = 0.0;     // L_aux, mean over the MoE blocks (unscaled)
  double z_loss = 0.0;       // L_z, mean over the MoE blocks (unscaled)
  double drop_rate = 0.0;    // mean over the MoE blocks
  double utilisation = 0.0;  // max over the MoE blocks
  int64_t tokens = 0;
  // [layers x E]: this rank's routes per block and expert (before capacity); a dense block's row is zero
  std::vector<int64_t> expert_counts;
};

class MoeTransformer {
 private:
  struct Block;
  struct Activations;

 public:
  // ep_group: the EP_MP group of this rank (size M_E); it must outlive the model. The routed-expert path is
  // execution.moe.path. With the rowwise path and max_microbatch_tokens > 0, all blocks share one symmetric
  // heap and one lease pool whose slots hold the dispatch payload of max_microbatch_tokens tokens per rank
  // (seed 000 §5.7); otherwise each block's path keeps private buffers.
  MoeTransformer(ModelConfig config, ModelExecution execution, Comm& ep_group,
                 int64_t max_microbatch_tokens = 0, ModelFeatures features = {});
  ~MoeTransformer();
  MoeTransformer(const MoeTransformer&) = delete;
  MoeTransformer& operator=(const MoeTransformer&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelExecution& execution() const { return execution_; }
  const ModelFeatures& features() const { return features_; }
  void init(uint64_t seed);
  // Every parameter (dense and this rank's expert shard), values and gradients share the model's storage.
  std::vector<Parameter>& parameters() { return params_; }
  void zero_grads();
  // With execution().bf16_products: makes (the first call) or refreshes in place the BF16 copies of every
  // weight a BF16 product reads (attention's projections, the LM head, the routed, shared and dense MLP
  // experts) from their f32 values, charged to the weights' memory categories, and hands each parameter its
  // copy (Parameter::bf16_copy), which the optimizer then refreshes as it updates the values. A trainer calls
  // it once the weights are initialised or loaded, and again whenever they change outside the optimizer
  // (experts moved between ranks). No-op with f32 products.
  void refresh_bf16_copies();
  // Whether block `layer` has an MoE MLP (false for a dense MLP layer). moe(layer) throws expar::Error for a
  // dense block; first_moe() is the first MoE block's (the experts' placement is every MoE block's).
  bool has_moe(int layer) const;
  MoeLayer& moe(int layer);
  MoeLayer& first_moe();
  // Whether block `layer`'s MoE MLP runs with activation recomputation (execution().recompute_moe_layers at
  // construction; false for a dense block); set_recompute_moe changes it for the forwards that follow (a
  // dense block refuses true).
  bool recomputes_moe(int layer) const;
  void set_recompute_moe(int layer, bool recompute);
  // Every MoE block's expert placement (MoeLayer::set_placement), and which expert slots count in the
  // gradient norm; between steps only, the slots' weights moved by the caller (train/expert_rebalance).
  void set_expert_placement(const ExpertPlacement& next);
  // After a dry-run step: the shared lease pool may not grow any more (no-op without a shared pool).
  void freeze_leases();
  // The microbatch index of the forwards that follow (-1: none), for the MoE blocks' lease tags.
  void set_microbatch(int microbatch);
  const LeasePool* lease_pool() const { return lease_pool_.get(); }
  // Context parallelism (nn/context_parallel_attention.hpp): with a CP group of C > 1 ranks, every forward
  // that follows takes chunk cp->rank() of its sequences (`seq` is the chunk length S/C) and attention
  // gathers the other chunks' keys and values over the group; nullptr (the default): whole sequences. The
  // routers' aux and z losses of a training forward (forward_backward, forward_train) are then the mean over
  // `loss_batches` equal consecutive groups of its sequences (which must divide them) of each group's
  // losses, each over the group's whole sequences: statistics summed over the CP group (RouterLossScope).
  // loss_batches = C makes each group the sequences one rank of a C = 1 run on as many ranks routes, so
  // the losses and their gradients are that run's. Forward-only passes (evaluate, logits) have no backward
  // and report each rank's own tokens' losses, with no collective. The group must outlive its use. Latent
  // attention (DeepSeek) gathers the latent rows instead (nn::cp_latent_attention_forward). A router with
  // the sequence-wise load-balancing loss (RouterConfig::aux_loss_kind Sequence) takes one loss batch per
  // sequence instead of `loss_batches`, with or without a CP group.
  void set_context_parallel(Comm* cp, int loss_batches = 1);

  // Forward and backward of one microbatch: tokens/targets int32 [B*S]. Gradients are ADDED to the
  // parameters' grads; the loss gradient is divided by `loss_normalizer` (tokens of this rank over all
  // microbatches of the step, so accumulation averages). Collective over the EP group.
  StepMetrics forward_backward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                               int64_t batch, int64_t seq, int64_t loss_normalizer);

  // The same split in two, for schedules with several microbatches in flight (F1 F2 B2 B1, as under
  // pipeline parallelism, seed 000 §5.7): forward_train keeps what the backward of its microbatch needs
  // (activations, the loss gradient, the MoE blocks' leases) in a Pending; backward(pending) consumes it.
  // Every rank of the EP group must run the same sequence of forwards and backwards (they are collective).
  class Pending {
   public:
    Pending();
    ~Pending();
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    const StepMetrics& metrics() const { return metrics_; }
    bool done() const { return acts_ == nullptr; }

   private:
    friend class MoeTransformer;
    std::unique_ptr<Activations> acts_;
    Tensor grad_logits_;
    StepMetrics metrics_;
  };
  Pending forward_train(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                        int64_t batch, int64_t seq, int64_t loss_normalizer);
  StepMetrics backward(Pending& pending);
  // Forward only: mean cross-entropy over the tokens (collective over the EP group).
  StepMetrics evaluate(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t batch,
                       int64_t seq);
  // Forward only: logits [B*S, vocab] (collective over the EP group).
  Tensor logits(const std::vector<int32_t>& tokens, int64_t batch, int64_t seq);

 private:
  Tensor forward(const std::vector<int32_t>& tokens, int64_t batch, int64_t seq, Activations* acts,
                 StepMetrics& metrics);
  Parameter& add_param(const std::string& name, Shape shape, ParamKind kind, bool decay);
  // The expert tensors' norm rows for the current placement: with replicas, each expert's first slot.
  void mark_replica_norm_rows();
  void link_bf16_copies();  // Parameter::bf16_copy of every parameter with a copy

  ModelConfig config_;
  ModelExecution execution_;
  ModelFeatures features_;
  Comm& ep_group_;
  Comm* cp_group_ = nullptr;  // set_context_parallel
  int loss_batches_ = 1;
  nn::Rope rope_;
  std::vector<Parameter> params_;
  // Declared before blocks_: the blocks' paths hold leases on them, so they must be destroyed after.
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<LeasePool> lease_pool_;
  std::vector<std::unique_ptr<Block>> blocks_;
  Tensor embed_, embed_grad_, final_norm_, final_norm_grad_, head_, head_grad_;
  Tensor head_bf16_;  // refresh_bf16_copies
};

}  // namespace expar
