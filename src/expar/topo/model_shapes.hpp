#pragma once
// Model shapes for `expar plan`: the sizes that determine parameter counts, from the public config.json of
// real MoE models (presets) or from explicit values. Every expert and dense MLP is gated (SwiGLU-style: gate,
// up and down projections, 3 * d_model * hidden weights). Parameter counts exclude multi-token-prediction
// heads and rotary tables.
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

enum class AttentionKind : uint8_t { Gqa, Mla };
// RMSNorms on q and k after their projections: none, per head over head_dim values (Qwen3), or over each
// whole projection (OLMoE). Their inputs are saved for the backward (train/plan_activations.hpp).
enum class QkNormKind : uint8_t { None, PerHead, Projection };

struct ModelShape {
  std::string name;
  int layers = 0;   // transformer blocks
  int d_model = 0;  // hidden size
  int vocab = 0;
  bool tied_embeddings = false;

  // Attention. GQA: q [d, heads*head_dim], k and v [d, kv_heads*head_dim], o [heads*head_dim, d].
  AttentionKind attention = AttentionKind::Gqa;
  int heads = 0, kv_heads = 0, head_dim = 0;
  bool attention_bias = false;            // biases on q, k, v and o
  int64_t attention_extra_params = 0;     // per layer: q/k norms, attention sinks
  QkNormKind qk_norm = QkNormKind::None;  // which q/k norms (their gains are in attention_extra_params)
  // MLA (DeepSeek-V3): low-rank q and joint kv compression.
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;

  // MoE. The first `dense_layers` blocks have a dense MLP of `dense_hidden` instead.
  int num_experts = 0;              // routed experts N
  int top_k = 0;                    // K
  int expert_hidden = 0;            // intermediate size of one routed expert
  int shared_experts = 0;           // always-active experts, dense (replicated) parameters
  int shared_hidden = 0;            // intermediate size of one shared expert
  bool shared_expert_gate = false;  // Qwen-MoE: the shared experts' output scaled by sigmoid(x · gate [d])
  bool expert_bias = false;         // biases on gate/up ([2h]) and down ([d])
  bool router_bias = false;         // a bias (or correction bias) of size N
  int dense_layers = 0;
  int dense_hidden = 0;

  int moe_layers() const { return layers - dense_layers; }
};

// Throws expar::Error naming the first field that is out of range.
void validate(const ModelShape& shape);

// Presets: olmoe-1b-7b, mixtral-8x7b, qwen3-30b-a3b, gpt-oss-120b, deepseek-v3.
const std::vector<ModelShape>& model_presets();
std::vector<std::string> model_preset_names();
// Throws expar::Error listing the preset names for an unknown name.
const ModelShape& model_preset(const std::string& name);

// Parameter counts (elements).
int64_t attention_params_per_layer(const ModelShape& s);  // projections, biases, extra; norms excluded
int64_t norm_params_per_layer(const ModelShape& s);       // the two RMSNorms around attention and MLP
int64_t one_expert_params(const ModelShape& s);           // one routed expert
int64_t router_params_per_layer(const ModelShape& s);
int64_t shared_expert_params_per_layer(const ModelShape& s);
int64_t dense_mlp_params_per_layer(const ModelShape& s);  // only in the first dense_layers blocks
int64_t embedding_params(const ModelShape& s);            // input embedding
int64_t lm_head_params(const ModelShape& s);              // 0 when tied
int64_t routed_expert_params(const ModelShape& s);        // P_E of equation 9: all routed experts, all layers
int64_t total_params(const ModelShape& s);
int64_t active_params(const ModelShape& s);  // per token: top_k routed experts instead of N

}  // namespace expar
