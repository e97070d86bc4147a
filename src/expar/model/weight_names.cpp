#include "expar/model/weight_names.hpp"

namespace expar {

std::string expert_tensor_name(const std::string& experts_parameter, int expert) {
  const size_t dot = experts_parameter.rfind('.');
  return experts_parameter.substr(0, dot) + "." + std::to_string(expert) + experts_parameter.substr(dot);
}

WeightNames expar_weight_names() {
  WeightNames n;
  n.embed = "embed";
  n.final_norm = "final_norm";
  n.lm_head = "lm_head";
  n.layer = [](int l, const std::string& key) {
    const std::string p = "layers." + std::to_string(l);
    if (key == "attn_norm" || key == "mlp_norm") return p + "." + key;
    if (key == "router" || key == "score_bias" || key == "router_bias") return p + ".moe." + key;
    return p + ".attn." + key;
  };
  n.expert = [](int l, int e, const std::string& key) {
    return expert_tensor_name("layers." + std::to_string(l) + ".moe.experts." + key, e);
  };
  n.shared = [](int l, const std::string& key) { return "layers." + std::to_string(l) + ".shared." + key; };
  n.dense = [](int l, const std::string& key) { return "layers." + std::to_string(l) + ".mlp." + key; };
  return n;
}

namespace {

// gate_proj, up_proj, down_proj for w1, w3, w2.
const char* hf_mlp_proj(const std::string& key) {
  return key == "w1" ? "gate_proj" : key == "w3" ? "up_proj" : "down_proj";
}

// A dense layer's MLP: model.layers.L.mlp.{gate,up,down}_proj (DeepSeek, Qwen-MoE's mlp_only_layers).
std::string hf_dense_name(int l, const std::string& key) {
  return "model.layers." + std::to_string(l) + ".mlp." + hf_mlp_proj(key) + ".weight";
}

// Names shared by the Hugging Face decoder layouts: norms and self-attention.
std::string hf_layer_name(int l, const std::string& key) {
  const std::string p = "model.layers." + std::to_string(l);
  // Latent attention (DeepSeek).
  if (key == "wq_a") return p + ".self_attn.q_a_proj.weight";
  if (key == "q_a_norm") return p + ".self_attn.q_a_layernorm.weight";
  if (key == "wq_b") return p + ".self_attn.q_b_proj.weight";
  if (key == "wkv_a") return p + ".self_attn.kv_a_proj_with_mqa.weight";
  if (key == "kv_a_norm") return p + ".self_attn.kv_a_layernorm.weight";
  if (key == "wkv_b") return p + ".self_attn.kv_b_proj.weight";
  if (key == "attn_norm") return p + ".input_layernorm.weight";
  if (key == "mlp_norm") return p + ".post_attention_layernorm.weight";
  if (key == "sinks") return p + ".self_attn.sinks";
  if (key == "q_norm" || key == "k_norm") return p + ".self_attn." + key + ".weight";
  const bool bias = key.size() == 2 && key[0] == 'b';
  const char c = key.back();
  const std::string proj = c == 'q' ? "q_proj" : c == 'k' ? "k_proj" : c == 'v' ? "v_proj" : "o_proj";
  return p + ".self_attn." + proj + (bias ? ".bias" : ".weight");
}

WeightNames hf_names() {
  WeightNames n;
  n.embed = "model.embed_tokens.weight";
  n.final_norm = "model.norm.weight";
  n.lm_head = "lm_head.weight";
  n.dense = hf_dense_name;
  return n;
}

}  // namespace

WeightNames mixtral_weight_names() {
  WeightNames n = hf_names();
  n.layer = [](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l);
    if (key == "router") return p + ".block_sparse_moe.gate.weight";
    if (key == "score_bias") return p + ".block_sparse_moe.score_bias";  // never present: Mixtral has none
    return hf_layer_name(l, key);
  };
  n.expert = [](int l, int e, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(e) + "." +
           key + ".weight";
  };
  n.shared = [](int l, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".shared_expert." + key + ".weight";  // never present
  };
  return n;
}

WeightNames qwen_moe_weight_names() {
  WeightNames n = hf_names();
  n.layer = [](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l);
    if (key == "router") return p + ".mlp.gate.weight";
    if (key == "score_bias") return p + ".mlp.score_bias";  // never present
    return hf_layer_name(l, key);
  };
  auto proj = hf_mlp_proj;
  n.expert = [proj](int l, int e, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + proj(key) +
           ".weight";
  };
  n.shared = [proj](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.shared_expert";
    if (key == "gate") return p + "_gate.weight";
    return p + "." + proj(key) + ".weight";
  };
  return n;
}

WeightNames qwen3_moe_weight_names() {
  WeightNames n = qwen_moe_weight_names();
  n.shared = [](int l, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".mlp.shared_expert." + key;  // never present
  };
  return n;
}

WeightNames gpt_oss_weight_names() {
  WeightNames n = hf_names();
  n.layer = [](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l);
    if (key == "router") return p + ".mlp.router.weight";
    if (key == "router_bias") return p + ".mlp.router.bias";
    if (key == "score_bias") return p + ".mlp.router.score_bias";  // never present
    return hf_layer_name(l, key);
  };
  n.expert = [](int l, int, const std::string& key) {  // stacked: see load_gpt_oss_experts
    return "model.layers." + std::to_string(l) + ".mlp.experts." + key;
  };
  n.shared = [](int l, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".mlp.shared_expert." + key;  // never present
  };
  return n;
}

WeightNames deepseek_weight_names() {
  WeightNames n = hf_names();
  n.layer = [](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l);
    if (key == "router") return p + ".mlp.gate.weight";
    if (key == "score_bias") return p + ".mlp.gate.e_score_correction_bias";
    return hf_layer_name(l, key);
  };
  n.expert = [](int l, int e, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." +
           hf_mlp_proj(key) + ".weight";
  };
  n.shared = [](int l, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".mlp.shared_experts." + hf_mlp_proj(key) + ".weight";
  };
  return n;
}

WeightNames weight_names(ModelFormat format) {
  switch (format) {
    case ModelFormat::Expar:
      return expar_weight_names();
    case ModelFormat::Mixtral:
      return mixtral_weight_names();
    case ModelFormat::QwenMoe:
      return qwen_moe_weight_names();
    case ModelFormat::Qwen3Moe:
    case ModelFormat::Olmoe:  // the same names: mlp.gate, mlp.experts.J.{gate,up,down}_proj, no shared expert
      return qwen3_moe_weight_names();
    case ModelFormat::GptOss:
      return gpt_oss_weight_names();
    case ModelFormat::DeepseekV3:
    case ModelFormat::DeepseekV2:
      return deepseek_weight_names();
  }
  return expar_weight_names();
}

std::map<std::string, std::string> translate_weight_names(const WeightNames& from, const WeightNames& to,
                                                          const ModelConfig& config) {
  std::map<std::string, std::string> names{
      {from.embed, to.embed}, {from.final_norm, to.final_norm}, {from.lm_head, to.lm_head}};
  for (int l = 0; l < config.layers; ++l) {
    for (const char* key :
         {"attn_norm", "wq",       "wk",   "wv",    "wo",        "mlp_norm",    "router", "score_bias",
          "bq",        "bk",       "bv",   "bo",    "sinks",     "router_bias", "q_norm", "k_norm",
          "wq_a",      "q_a_norm", "wq_b", "wkv_a", "kv_a_norm", "wkv_b"})
      names[from.layer(l, key)] = to.layer(l, key);
    for (const char* key : {"w1", "w3", "w2"}) names[from.dense(l, key)] = to.dense(l, key);
    for (int e = 0; e < config.moe.router.num_experts; ++e)
      for (const char* key : {"w1", "w3", "w2"}) names[from.expert(l, e, key)] = to.expert(l, e, key);
    for (const char* key : {"w1", "w3", "w2", "gate"}) names[from.shared(l, key)] = to.shared(l, key);
  }
  return names;
}

}  // namespace expar
