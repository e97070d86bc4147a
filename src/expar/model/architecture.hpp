#pragma once
// THE architecture description of every supported model family: ModelConfig (the shapes and the MoE MLP,
// shared with training) plus ModelFeatures (what the Hugging Face families add). One description, read from
// a checkpoint's manifest (ours) or a Hugging Face config.json (model/hf_config.hpp), used by the inference
// engine and `expar eval`.
//
//  ours       manifest.json + dense.safetensors + experts-<m>.safetensors (expar train)
//  mixtral    softmax router, top-k renormalised, SwiGLU experts, optional sliding window on every layer
//  qwen-moe   model_type qwen2_moe (Qwen1.5-MoE / Qwen2-MoE): q/k/v biases (qkv_bias), softmax router
//             renormalised over the k only with norm_topk_prob, a shared expert scaled by
//             sigmoid(x · shared_expert_gate)
//  qwen3-moe  model_type qwen3_moe: RMSNorm over each q and k head before RoPE, optional q/k/v/o biases
//             (attention_bias), softmax router with optional norm_topk_prob, no shared expert
//  olmoe      model_type olmoe: RMSNorm over the whole q and k projections before RoPE, softmax router with
//             optional norm_topk_prob
//  gpt-oss    model_type gpt_oss: q/k/v/o biases, a learned sink logit per head, sliding-window and full
//             attention layers (layer_types), router with bias and softmax over the top-k logits, fused
//             gate_up_proj experts with biases and the clamped SwiGLU, YaRN rope by default
//  deepseek-v3  model_type deepseek_v3 (DeepSeek-V3/R1, Kimi-K2, Moonlight): multi-head latent attention,
//             sigmoid router with a selection-only correction bias, group-limited top-k, renormalised and
//             scaled by routed_scaling_factor; ungated shared experts; the first layers dense MLPs
//  deepseek-v2  model_type deepseek_v2 (DeepSeek-V2/V2-Lite): the same attention and MLP layers, softmax
//             router (greedy or group_limited_greedy top-k), scaled by routed_scaling_factor
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/model/model_config.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/rope.hpp"

namespace expar {

enum class ModelFormat : uint8_t { Expar, Mixtral, QwenMoe, Qwen3Moe, Olmoe, GptOss, DeepseekV3, DeepseekV2 };
// "ours", "mixtral", "qwen-moe", "qwen3-moe", "olmoe", "gpt-oss", "deepseek-v3", "deepseek-v2".
std::string model_format_name(ModelFormat format);
// The names above; throws expar::Error listing them otherwise.
ModelFormat model_format_from_name(const std::string& name);
// The Hugging Face model_type of a format ("" for ours), and back.
std::string hf_model_type(ModelFormat format);
std::optional<ModelFormat> format_of_model_type(const std::string& model_type);
// Every format, ours first.
const std::vector<ModelFormat>& all_model_formats();
// Their names, in that order (the choices of the command line's --format, with "auto").
std::vector<std::string> model_format_names();

enum class RouterKind : uint8_t {
  Scores,  // router_forward: score function, top-k, optional renormalisation (ours, Mixtral, Qwen, OLMoE)
  BiasedTopkSoftmax  // gpt-oss: a router bias (loaded as router_bias); moe/router computes it with
                     // RouterConfig::softmax_over_topk: top-k of the biased logits, softmax over those k
};
// The experts' activation (moe/expert_mlp.hpp, where they run): SwiGLU, or gpt-oss's clamped SwiGLU with
// gate/up/down biases.
using ExpertActivation = ExpertMlpActivation;
// q/k RMSNorm: none, per head (Qwen3) or over the whole projection (OLMoE); see nn/attention.hpp.
using QkNorm = nn::QkNorm;

// Multi-head latent attention (DeepSeek-V2/V3, nn/latent_attention.hpp) in place of the q/k/v projections:
// keys and values come from one compressed latent of kv_lora_rank values per token plus one shared rope key
// of qk_rope_head_dim (= ModelConfig::head_dim, the rope's width); ModelConfig::heads counts the query heads.
struct LatentAttentionDims {
  int64_t q_lora_rank = 0;   // 0: a plain q projection; else q_a_proj -> RMSNorm -> q_b_proj
  int64_t kv_lora_rank = 0;  // 0: no latent attention (every other family)
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // softmax scale: (qk_nope_head_dim + qk_rope_head_dim)^-1/2 times YaRN's mscale(factor, mscale_all_dim)²
  double softmax_scale = 0.0;
  bool rope_interleave = true;  // rope pairs (2i, 2i+1), as DeepSeek's checkpoints store them
  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// What a family adds to ModelConfig (the training model has none of it). Defaults: our model.
struct ModelFeatures {
  bool qkv_bias = false;            // self_attn.{q,k,v}_proj.bias
  bool o_bias = false;              // self_attn.o_proj.bias
  bool attention_sinks = false;     // self_attn.sinks [heads]
  QkNorm qk_norm = QkNorm::None;    // self_attn.{q,k}_norm.weight
  std::vector<int64_t> window;      // per layer: > 0 sliding window, 0 full; empty: every layer full
  bool shared_expert_gate = false;  // shared expert scaled by sigmoid(x · gate)
  RouterKind router = RouterKind::Scores;
  ExpertActivation activation = ExpertActivation::Swiglu;
  bool fused_experts = false;    // gpt-oss: stacked gate_up_proj / down_proj with biases
  bool tied_embeddings = false;  // the LM head is the embedding
  LatentAttentionDims mla;       // DeepSeek: enabled() replaces wq/wk/wv
  // Per layer: a dense SwiGLU MLP of dense_mlp_hidden in place of the MoE block (DeepSeek's first
  // first_k_dense_replace layers and those off moe_layer_freq; Qwen-MoE's mlp_only_layers and
  // decoder_sparse_step). Empty: every layer is an MoE layer.
  std::vector<uint8_t> dense_mlp;
  int64_t dense_mlp_hidden = 0;
  // DeepSeek's multi-token-prediction layers after the last layer (num_nextn_predict_layers): not loaded,
  // since generation does not use them; the startup line names them.
  int ignored_mtp_layers = 0;
  bool is_dense_mlp(int layer) const {
    return static_cast<size_t>(layer) < dense_mlp.size() && dense_mlp[static_cast<size_t>(layer)] != 0;
  }
  // The rope type and its parameters; its theta is ModelConfig::rope_theta (rope_scaling() joins them).
  nn::RopeScaling rope;
  int64_t window_of(int layer) const {
    return static_cast<size_t>(layer) < window.size() ? window[static_cast<size_t>(layer)] : 0;
  }
};

// The rope of a model: the features' type and parameters with the config's theta.
nn::RopeScaling rope_scaling(const ModelConfig& config, const ModelFeatures& features);

struct Architecture {
  ModelFormat format = ModelFormat::Expar;
  ModelConfig config;
  ModelFeatures features;
};

}  // namespace expar
