#pragma once
// RankWeights: what one inference rank holds (seed 002, "Expert Weight Distribution"):
//  - attention: the heads of its TP rank (Wq/Wk/Wv rows and Wo columns of those heads; when TP exceeds the
//    key/value heads, each rank keeps the one key/value head its query heads use, replicated as needed);
//  - the router (replicated) and optional score bias;
//  - its local experts, sharded on the intermediate dimension over its EP_TP group (w1/w3 rows, w2 columns);
//  - the shared expert TP-sharded over the TP group (or whole on TP rank 0 when TP does not divide it);
//  - embedding, final norm and LM head (replicated).
// WeightNames maps these to a checkpoint's tensor names, so our checkpoints and Hugging Face Mixtral load
// through the same code.
#include <functional>
#include <string>
#include <vector>

#include "expar/infer/tensor_store.hpp"
#include "expar/model/model_config.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/nn/attention.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::infer {

struct LayerWeights {
  Tensor attn_norm, mlp_norm;              // [d]
  nn::AttentionWeights attn;               // local heads
  Tensor router;                           // [E, d]
  Tensor score_bias;                       // [E] or undefined
  ExpertWeights experts;                   // [E_L, h / ep_tp, d], [E_L, h / ep_tp, d], [E_L, d, h / ep_tp]
  Tensor shared_w1, shared_w3, shared_w2;  // [hs_l, d], [hs_l, d], [d, hs_l]; undefined: none here
};

struct RankWeights {
  ModelConfig config;
  nn::AttentionShape local_attn;  // heads held here
  std::vector<int> local_experts;
  Tensor embed, final_norm, lm_head;
  std::vector<LayerWeights> layers;
};

// Tensor names of one checkpoint layout. layer(l, key) for key in {attn_norm, wq, wk, wv, wo, mlp_norm,
// router, score_bias}; expert(l, e, key) for key in {w1, w3, w2} ([h, d], [h, d], [d, h]); shared(l, key)
// likewise for the shared expert.
struct WeightNames {
  std::string embed, final_norm, lm_head;
  std::function<std::string(int, const std::string&)> layer;
  std::function<std::string(int, int, const std::string&)> expert;
  std::function<std::string(int, const std::string&)> shared;
};
WeightNames expar_weight_names();    // train/checkpoint.hpp's names
WeightNames mixtral_weight_names();  // model.layers.L.block_sparse_moe.experts.J.w1.weight, ...

// This rank's weights of `config` from `store`. Throws expar::Error when the layout does not fit the model
// (heads or intermediate not divisible, expert count mismatch) or a tensor is missing.
RankWeights load_rank_weights(const TensorStore& store, const WeightNames& names, const ModelConfig& config,
                              const InferenceLayout& layout, int rank);

}  // namespace expar::infer
