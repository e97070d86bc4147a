#pragma once
// The tensor names of each checkpoint layout (ours and the Hugging Face families), one description used by
// the inference loader (infer/rank_weights) and by training's checkpoints (train/checkpoint), so a model
// trained by expar is saved under the names its family's readers (transformers, expar generate) expect.
#include <functional>
#include <map>
#include <string>

#include "expar/model/architecture.hpp"

namespace expar {

// Tensor names of one checkpoint layout. layer(l, key) for key in {attn_norm, wq, wk, wv, wo, mlp_norm,
// router, score_bias, bq, bk, bv, bo, sinks, router_bias, q_norm, k_norm}; expert(l, e, key) for key in {w1,
// w3, w2}
// ([h, d], [h, d], [d, h]); shared(l, key) likewise for the shared expert, and "gate" for its gate [1, d];
// dense(l, key) likewise for a dense layer's MLP. Latent attention's layer keys: wq (or wq_a, q_a_norm,
// wq_b), wkv_a, kv_a_norm, wkv_b, wo. A format names only the keys it has.
struct WeightNames {
  std::string embed, final_norm, lm_head;
  std::function<std::string(int, const std::string&)> layer;
  std::function<std::string(int, int, const std::string&)> expert;
  std::function<std::string(int, const std::string&)> shared;
  std::function<std::string(int, const std::string&)> dense;
};
WeightNames expar_weight_names();  // train/checkpoint.hpp's names
// Our name of one expert's tensor, from the name of the parameter that stacks every local expert:
// "layers.3.moe.experts.w1" and expert 5 -> "layers.3.moe.experts.5.w1" (expar_weight_names().expert).
std::string expert_tensor_name(const std::string& experts_parameter, int expert);
WeightNames mixtral_weight_names();    // model.layers.L.block_sparse_moe.experts.J.w1.weight, ...
WeightNames qwen_moe_weight_names();   // model.layers.L.mlp.experts.J.gate_proj.weight, mlp.shared_expert.*
WeightNames qwen3_moe_weight_names();  // Qwen3-MoE and OLMoE: qwen_moe's names without the shared expert
WeightNames gpt_oss_weight_names();  // model.layers.L.mlp.router.*, self_attn.sinks (experts: hf_experts.hpp)
// DeepSeek-V2/V3: self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj; mlp.gate.{weight, e_score_correction_bias}, mlp.experts.J.*, mlp.shared_experts.*
WeightNames deepseek_weight_names();
WeightNames weight_names(ModelFormat format);

// Every tensor name of `config` under `from` mapped to its name under `to` (keys a format does not have map
// to that format's never-present names; callers look up only the tensors the model holds).
std::map<std::string, std::string> translate_weight_names(const WeightNames& from, const WeightNames& to,
                                                          const ModelConfig& config);

}  // namespace expar
