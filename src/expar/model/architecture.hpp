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
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/model/model_config.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/rope.hpp"

namespace expar {

enum class ModelFormat : uint8_t { Expar, Mixtral, QwenMoe, Qwen3Moe, Olmoe, GptOss };
// "ours", "mixtral", "qwen-moe", "qwen3-moe", "olmoe", "gpt-oss".
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
