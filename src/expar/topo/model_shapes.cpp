#include "expar/topo/model_shapes.hpp"

#include "expar/core/error.hpp"

namespace expar {

namespace {

std::vector<ModelShape> make_presets() {
  std::vector<ModelShape> out;
  {
    // allenai/OLMoE-1B-7B-0924 config.json: num_hidden_layers 16, hidden_size 2048, intermediate_size 1024,
    // num_experts 64, num_experts_per_tok 8, num_attention_heads 16, num_key_value_heads 16 (head_dim
    // 2048/16 = 128), vocab_size 50304, tie_word_embeddings false; q_norm and k_norm are RMSNorms over the
    // full q and k width (2048 each). About 6.9B parameters, 1.3B active.
    ModelShape s;
    s.name = "olmoe-1b-7b";
    s.layers = 16, s.d_model = 2048, s.vocab = 50304, s.tied_embeddings = false;
    s.heads = 16, s.kv_heads = 16, s.head_dim = 128, s.attention_extra_params = 2048 + 2048;
    s.qk_norm = QkNormKind::Projection;
    s.num_experts = 64, s.top_k = 8, s.expert_hidden = 1024;
    out.push_back(s);
  }
  {
    // mistralai/Mixtral-8x7B-v0.1 config.json: num_hidden_layers 32, hidden_size 4096, intermediate_size
    // 14336, num_local_experts 8, num_experts_per_tok 2, num_attention_heads 32, num_key_value_heads 8
    // (head_dim 128), vocab_size 32000, tie_word_embeddings false. About 46.7B parameters.
    ModelShape s;
    s.name = "mixtral-8x7b";
    s.layers = 32, s.d_model = 4096, s.vocab = 32000;
    s.heads = 32, s.kv_heads = 8, s.head_dim = 128;
    s.num_experts = 8, s.top_k = 2, s.expert_hidden = 14336;
    out.push_back(s);
  }
  {
    // Qwen/Qwen3-30B-A3B config.json: num_hidden_layers 48, hidden_size 2048, moe_intermediate_size 768,
    // num_experts 128, num_experts_per_tok 8, decoder_sparse_step 1 and mlp_only_layers [] (every layer MoE),
    // num_attention_heads 32, num_key_value_heads 4, head_dim 128, attention_bias false, vocab_size 151936,
    // tie_word_embeddings false; q_norm and k_norm over head_dim (128 each). About 30.5B parameters.
    ModelShape s;
    s.name = "qwen3-30b-a3b";
    s.layers = 48, s.d_model = 2048, s.vocab = 151936;
    s.heads = 32, s.kv_heads = 4, s.head_dim = 128, s.attention_extra_params = 128 + 128;
    s.qk_norm = QkNormKind::PerHead;
    s.num_experts = 128, s.top_k = 8, s.expert_hidden = 768;
    out.push_back(s);
  }
  {
    // openai/gpt-oss-120b config.json: num_hidden_layers 36, hidden_size 2880, intermediate_size 2880,
    // num_local_experts 128, num_experts_per_tok 4, num_attention_heads 64, num_key_value_heads 8, head_dim
    // 64, attention_bias true (plus one learned sink per head), vocab_size 201088, tie_word_embeddings false;
    // experts carry gate_up_proj_bias [2*2880] and down_proj_bias [2880]; the router has a bias.
    // About 116.8B parameters.
    ModelShape s;
    s.name = "gpt-oss-120b";
    s.layers = 36, s.d_model = 2880, s.vocab = 201088;
    s.heads = 64, s.kv_heads = 8, s.head_dim = 64, s.attention_bias = true, s.attention_extra_params = 64;
    s.num_experts = 128, s.top_k = 4, s.expert_hidden = 2880, s.expert_bias = true, s.router_bias = true;
    out.push_back(s);
  }
  {
    // deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, hidden_size 7168, first_k_dense_replace 3
    // with intermediate_size 18432, moe_intermediate_size 2048, n_routed_experts 256, n_shared_experts 1,
    // num_experts_per_tok 8, num_attention_heads 128 (MLA: q_lora_rank 1536, kv_lora_rank 512,
    // qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), vocab_size 129280, tie_word_embeddings
    // false; the router has e_score_correction_bias [256]. About 671B parameters without the MTP module.
    ModelShape s;
    s.name = "deepseek-v3";
    s.layers = 61, s.d_model = 7168, s.vocab = 129280;
    s.attention = AttentionKind::Mla, s.heads = 128, s.kv_heads = 128, s.head_dim = 192;
    s.q_lora_rank = 1536, s.kv_lora_rank = 512, s.qk_nope_head_dim = 128, s.qk_rope_head_dim = 64;
    s.v_head_dim = 128;
    s.num_experts = 256, s.top_k = 8, s.expert_hidden = 2048, s.router_bias = true;
    s.shared_experts = 1, s.shared_hidden = 2048;
    s.dense_layers = 3, s.dense_hidden = 18432;
    out.push_back(s);
  }
  return out;
}

}  // namespace

void validate(const ModelShape& s) {
  auto positive = [&](const char* field, int64_t v) {
    EXPAR_CHECK(v >= 1, "model '{}': {}={} must be at least 1", s.name, field, v);
  };
  positive("layers", s.layers);
  positive("d_model", s.d_model);
  positive("vocab", s.vocab);
  positive("heads", s.heads);
  positive("num_experts", s.num_experts);
  positive("top_k", s.top_k);
  positive("expert_hidden", s.expert_hidden);
  EXPAR_CHECK(s.top_k <= s.num_experts, "model '{}': top_k={} exceeds num_experts={}: choose top_k <= {}",
              s.name, s.top_k, s.num_experts, s.num_experts);
  EXPAR_CHECK(s.dense_layers >= 0 && s.dense_layers < s.layers,
              "model '{}': dense_layers={} must be in [0, layers={}) so that at least one layer is MoE",
              s.name, s.dense_layers, s.layers);
  if (s.dense_layers > 0) positive("dense_hidden", s.dense_hidden);
  EXPAR_CHECK(s.shared_experts >= 0, "model '{}': shared_experts={} must not be negative", s.name,
              s.shared_experts);
  if (s.shared_experts > 0) positive("shared_hidden", s.shared_hidden);
  if (s.attention == AttentionKind::Gqa) {
    positive("kv_heads", s.kv_heads);
    positive("head_dim", s.head_dim);
    EXPAR_CHECK(
        s.heads % s.kv_heads == 0,
        "model '{}': heads={} is not a multiple of kv_heads={}: grouped-query attention needs whole groups",
        s.name, s.heads, s.kv_heads);
  } else {
    positive("kv_lora_rank", s.kv_lora_rank);
    positive("qk_nope_head_dim", s.qk_nope_head_dim);
    positive("qk_rope_head_dim", s.qk_rope_head_dim);
    positive("v_head_dim", s.v_head_dim);
  }
}

const std::vector<ModelShape>& model_presets() {
  static const std::vector<ModelShape> presets = make_presets();
  return presets;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : model_presets()) names.push_back(p.name);
  return names;
}

const ModelShape& model_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  fail("model preset '{}' is unknown: choose one of {}", name, fmt::join(model_preset_names(), ", "));
}

int64_t attention_params_per_layer(const ModelShape& s) {
  const int64_t d = s.d_model;
  if (s.attention == AttentionKind::Mla) {
    const int64_t h = s.heads;
    const int64_t qk_head = s.qk_nope_head_dim + s.qk_rope_head_dim;
    int64_t q = 0;
    if (s.q_lora_rank > 0) {
      // q_a_proj [d, q_lora], q_a_layernorm [q_lora], q_b_proj [q_lora, h * qk_head]
      q = d * s.q_lora_rank + s.q_lora_rank + int64_t{s.q_lora_rank} * h * qk_head;
    } else {
      q = d * h * qk_head;
    }
    // kv_a_proj_with_mqa [d, kv_lora + rope], kv_a_layernorm [kv_lora], kv_b_proj [kv_lora, h*(nope+v)]
    const int64_t kv = d * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank +
                       int64_t{s.kv_lora_rank} * h * (s.qk_nope_head_dim + s.v_head_dim);
    const int64_t o = h * s.v_head_dim * d;
    return q + kv + o + s.attention_extra_params;
  }
  const int64_t q_width = int64_t{s.heads} * s.head_dim;
  const int64_t kv_width = int64_t{s.kv_heads} * s.head_dim;
  int64_t n = d * q_width + 2 * d * kv_width + q_width * d;
  if (s.attention_bias) n += q_width + 2 * kv_width + d;
  return n + s.attention_extra_params;
}

int64_t norm_params_per_layer(const ModelShape& s) {
  return 2 * int64_t{s.d_model};
}

int64_t one_expert_params(const ModelShape& s) {
  const int64_t d = s.d_model, h = s.expert_hidden;
  return 3 * d * h + (s.expert_bias ? 2 * h + d : 0);
}

int64_t router_params_per_layer(const ModelShape& s) {
  return int64_t{s.num_experts} * s.d_model + (s.router_bias ? s.num_experts : 0);
}

int64_t shared_expert_params_per_layer(const ModelShape& s) {
  return int64_t{s.shared_experts} * 3 * s.d_model * s.shared_hidden +
         (s.shared_experts > 0 && s.shared_expert_gate ? int64_t{s.d_model} : 0);
}

int64_t dense_mlp_params_per_layer(const ModelShape& s) {
  return 3 * int64_t{s.d_model} * s.dense_hidden;
}

int64_t embedding_params(const ModelShape& s) {
  return int64_t{s.vocab} * s.d_model;
}

int64_t lm_head_params(const ModelShape& s) {
  return s.tied_embeddings ? 0 : int64_t{s.vocab} * s.d_model;
}

int64_t routed_expert_params(const ModelShape& s) {
  return int64_t{s.moe_layers()} * s.num_experts * one_expert_params(s);
}

namespace {
int64_t non_expert_params(const ModelShape& s) {
  const int64_t per_layer = attention_params_per_layer(s) + norm_params_per_layer(s);
  const int64_t moe_dense = router_params_per_layer(s) + shared_expert_params_per_layer(s);
  return s.layers * per_layer + s.moe_layers() * moe_dense + s.dense_layers * dense_mlp_params_per_layer(s) +
         embedding_params(s) + lm_head_params(s) + s.d_model;  // + the final norm
}
}  // namespace

int64_t total_params(const ModelShape& s) {
  return non_expert_params(s) + routed_expert_params(s);
}

int64_t active_params(const ModelShape& s) {
  return non_expert_params(s) + int64_t{s.moe_layers()} * s.top_k * one_expert_params(s);
}

}  // namespace expar
