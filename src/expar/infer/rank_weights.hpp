#pragma once
// RankWeights: what one inference rank holds (seed 002, "Expert Weight Distribution"):
//  - attention: the heads of its TP rank (Wq/Wk/Wv rows and Wo columns of those heads; when TP exceeds the
//    key/value heads, each rank keeps the one key/value head its query heads use, replicated as needed);
//  - the router (replicated) and optional score bias;
//  - its local experts, sharded on the intermediate dimension over its EP_TP group (w1/w3 rows, w2 columns);
//  - the shared expert TP-sharded over the TP group (or whole on TP rank 0 when TP does not divide it);
//  - embedding and LM head vocabulary-parallel over TP (rows [V·t/TP, V·(t+1)/TP) on TP rank t, as Megatron
//    and vLLM shard them), the final norm replicated.
// WeightNames maps these to a checkpoint's tensor names, so our checkpoints and Hugging Face Mixtral,
// Qwen-MoE and gpt-oss load through the same code. ModelFeatures says which extra tensors a format has:
// attention biases (q/k/v rows of the local heads like the weights; the o bias on TP rank 0 only, so the sum
// over the TP group adds it once), sinks of the local query heads, the shared-expert gate (replicated), the
// router bias (replicated), gpt-oss's fused experts and their biases (the down bias on the EP_TP rank holding
// intermediate shard 0, for the same reason). Latent attention (DeepSeek) holds the local heads' rows of
// q_proj / q_b_proj and kv_b_proj and columns of o_proj; q_a_proj, kv_a_proj_with_mqa and their norms are
// replicated (every TP rank computes the latent it caches). A dense layer holds its MLP TP-sharded like the
// shared expert, and no router or experts.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "expar/infer/hf_config.hpp"
#include "expar/model/model_config.hpp"
#include "expar/model/tensor_store.hpp"
#include "expar/model/weight_names.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/latent_attention.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::infer {

struct LayerWeights {
  Tensor attn_norm, mlp_norm;         // [d]
  nn::AttentionWeights attn;          // local heads
  nn::AttentionOptions attn_options;  // biases, sinks, sliding window (Hugging Face formats)
  nn::LatentAttentionWeights mla;     // latent attention (features.mla): in place of attn
  Tensor router;                      // [E, d]
  Tensor score_bias;                  // [E] or undefined
  Tensor router_bias;                 // [E] added to the router logits (gpt-oss) or undefined
  // [E_L, h / ep_tp, d], [E_L, h / ep_tp, d], [E_L, d, h / ep_tp], the family's activation, and (gpt-oss) the
  // gate/up biases b1, b3 [E_L, h / ep_tp] and the down bias b2 [E_L, d] on the shard-0 EP_TP rank (undefined
  // elsewhere and in the other families).
  ExpertWeights experts;
  Tensor shared_w1, shared_w3, shared_w2;  // [hs_l, d], [hs_l, d], [d, hs_l]; undefined: none here
  Tensor shared_gate;                      // [1, d]: output scaled by sigmoid(x · gate) (Qwen) or undefined
  // A dense layer's MLP (features.is_dense_mlp), sharded like the shared expert: [hd_l, d], [hd_l, d],
  // [d, hd_l]; undefined on a rank that holds none of it, and in MoE layers.
  Tensor dense_w1, dense_w3, dense_w2;
};

// True when an optional weight is present (defined and not empty).
inline bool present(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

struct RankWeights {
  ModelConfig config;
  ModelFeatures features;
  nn::AttentionShape local_attn;          // heads held here
  nn::LatentAttentionShape local_latent;  // latent attention's, with its local heads (features.mla)
  // This rank's logical experts in local slot order, as loaded: the layout's placement, the same in every
  // MoE layer (the engine keeps each layer's own after it moves experts: Engine::placement).
  std::vector<int> local_experts;
  Tensor embed, final_norm, lm_head;  // embed, lm_head: vocabulary rows [vocab_begin, + embed.dim(0))
  int64_t vocab_begin = 0;
  std::vector<LayerWeights> layers;
};

// The bytes a layer's weights hold (core/weight_view.hpp's weight_bytes: FP8 scale grids included).
int64_t layer_bytes(const LayerWeights& layer);

// The rows [s0, s1) of a TP-sharded MLP's intermediate dimension h held by TP rank t of tp: an even share
// when tp divides h, else all of it on rank 0 (and none elsewhere).
std::pair<int64_t, int64_t> mlp_shard(int64_t h, int tp, int t);

// The query heads [q0, q1) and key/value heads [k0, k1) held by TP rank t of tp (key/value heads split over
// TP, or one replicated per rank when TP exceeds them); throws expar::Error when the heads do not split.
struct HeadSplit {
  int64_t q0, q1, k0, k1;
};
HeadSplit head_split(const ModelConfig& config, int tp, int t);

// WeightNames (a checkpoint layout's tensor names) live in model/weight_names.hpp.
using expar::expar_weight_names;
using expar::gpt_oss_weight_names;
using expar::mixtral_weight_names;
using expar::qwen3_moe_weight_names;
using expar::qwen_moe_weight_names;
using expar::weight_names;
using expar::WeightNames;

// This rank's weights of `config` from `store`. Throws expar::Error when the layout does not fit the model
// (heads or intermediate not divisible, expert count mismatch) or a tensor is missing.
// `weight_dtype` BF16: the F32 weights the products multiply are converted at load (GenerateOptions).
RankWeights load_rank_weights(const TensorStore& store, const WeightNames& names, const ModelConfig& config,
                              const InferenceLayout& layout, int rank, const ModelFeatures& features = {},
                              std::optional<DType> weight_dtype = std::nullopt);
// The same for a ModelSpec (open_model_spec): its names, config and features.
RankWeights load_rank_weights(const TensorStore& store, const ModelSpec& spec, const InferenceLayout& layout,
                              int rank, std::optional<DType> weight_dtype = std::nullopt);
// The dtypes --weight-dtype converts to ("bf16"), and the one a name means (expar::Error naming them).
std::vector<std::string> weight_dtype_names();
DType weight_dtype_from_name(const std::string& name);
// The tensor store of a ModelSpec: ExparCheckpointStore for ours, ShardedStore for Hugging Face formats.
std::unique_ptr<TensorStore> open_store(const ModelSpec& spec);

}  // namespace expar::infer
