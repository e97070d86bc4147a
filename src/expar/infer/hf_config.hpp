#pragma once
// Checkpoint formats the engine runs, what each adds to ModelConfig, and Hugging Face config.json parsing.
//
//  ours      manifest.json + dense.safetensors + experts-<m>.safetensors (expar train)
//  mixtral   config.json model_type "mixtral": softmax router, top-k renormalised, SwiGLU experts
//  qwen-moe  config.json model_type "qwen2_moe" (Qwen1.5-MoE / Qwen2-MoE): q/k/v biases, softmax router
//            renormalised over the k only with norm_topk_prob, a shared expert scaled by
//            sigmoid(x · shared_expert_gate)
//  gpt-oss   config.json model_type "gpt_oss": q/k/v/o biases, a learned sink logit per head, sliding-window
//            and full attention layers (layer_types), router with bias and softmax over the top-k logits,
//            fused gate_up_proj experts with biases and the clamped SwiGLU. YaRN rope_scaling is refused:
//            the engine applies plain RoPE only.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "expar/model/model_config.hpp"

namespace expar::infer {

enum class ModelFormat : uint8_t { Expar, Mixtral, QwenMoe, GptOss };
// "ours", "mixtral", "qwen-moe", "gpt-oss".
std::string model_format_name(ModelFormat format);
// The names above; throws expar::Error listing them otherwise.
ModelFormat model_format_from_name(const std::string& name);

enum class RouterKind : uint8_t {
  Scores,            // router_forward: score function, top-k, optional renormalisation (ours, Mixtral, Qwen)
  BiasedTopkSoftmax  // gpt-oss: logits = x·Wᵀ + b, top-k of the logits, softmax over those k
};
enum class ExpertActivation : uint8_t {
  Swiglu,        // silu(gate)·up
  GptOssClamped  // gpt_oss_swiglu (hf_experts.hpp), with gate/up/down biases
};

// What a format adds to ModelConfig (the training model has none of it). Defaults: our model.
struct ModelFeatures {
  bool qkv_bias = false;            // self_attn.{q,k,v}_proj.bias
  bool o_bias = false;              // self_attn.o_proj.bias
  bool attention_sinks = false;     // self_attn.sinks [heads]
  std::vector<int64_t> window;      // per layer: > 0 sliding window, 0 full; empty: every layer full
  bool shared_expert_gate = false;  // shared expert scaled by sigmoid(x · gate)
  RouterKind router = RouterKind::Scores;
  ExpertActivation activation = ExpertActivation::Swiglu;
  bool fused_experts = false;    // gpt-oss: stacked gate_up_proj / down_proj with biases
  bool tied_embeddings = false;  // the LM head is the embedding
  int64_t window_of(int layer) const {
    return static_cast<size_t>(layer) < window.size() ? window[static_cast<size_t>(layer)] : 0;
  }
};

// A checkpoint ready to load: its format, where its files are, its config and features.
struct ModelSpec {
  ModelFormat format = ModelFormat::Expar;
  std::filesystem::path dir;          // the checkpoint directory
  std::filesystem::path tensor_path;  // what the tensor store opens: `dir`, an index json or one file
  ModelConfig config;
  ModelFeatures features;
};

// `path` is a checkpoint directory or a file in one (manifest.json, config.json,
// model.safetensors.index.json or a .safetensors file). Without `format` the format is detected
// (manifest.json: ours; config.json: its model_type); with it, files that say otherwise throw expar::Error
// naming both.
ModelSpec open_model_spec(const std::filesystem::path& path,
                          std::optional<ModelFormat> format = std::nullopt);

// Hugging Face config.json -> ModelConfig and features for the format (Mixtral, Qwen-MoE, gpt-oss). Throws
// expar::Error naming the field when one is missing, or a setting the engine does not run (Qwen dense MLP
// layers, sliding windows on Qwen, rope_scaling, a swiglu_limit other than 7).
ModelSpec hf_model_spec(const std::filesystem::path& dir, ModelFormat format);

// Mixtral (model_type "mixtral"): softmax router, top-k, weights renormalised over the k (Mixtral's
// routing), SwiGLU experts w1 (gate), w3 (up), w2 (down), rotate-half RoPE. Throws expar::Error naming the
// field when one is missing or the model_type is not mixtral.
ModelConfig mixtral_config(const std::filesystem::path& dir);

}  // namespace expar::infer
