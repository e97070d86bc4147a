#include "expar/model/model_shape.hpp"

#include "expar/core/error.hpp"

namespace expar {

namespace {

int checked_int(int64_t v, const char* field, const std::string& name) {
  EXPAR_CHECK(v >= 0 && v <= (int64_t{1} << 30),
              "model '{}': {}={} is outside [0, 2^30] that expar plan counts", name, field, v);
  return static_cast<int>(v);
}

}  // namespace

ModelShape model_shape(const Architecture& architecture, const std::string& name) {
  const ModelConfig& c = architecture.config;
  const ModelFeatures& f = architecture.features;
  ModelShape s;
  s.name = name;
  s.layers = c.layers;
  s.d_model = checked_int(c.model_dim, "hidden size", name);
  s.vocab = c.vocab;
  s.tied_embeddings = f.tied_embeddings;
  s.attention = AttentionKind::Gqa;
  s.heads = checked_int(c.heads, "heads", name);
  s.kv_heads = checked_int(c.kv_heads, "kv_heads", name);
  s.head_dim = checked_int(c.head_dim, "head_dim", name);
  const int64_t q_width = c.heads * c.head_dim, kv_width = c.kv_heads * c.head_dim;
  // ModelShape's attention_bias is all four projections' biases; other combinations are counted as extra.
  s.attention_bias = f.qkv_bias && f.o_bias;
  int64_t extra = 0;
  if (f.qkv_bias && !f.o_bias) extra += q_width + 2 * kv_width;
  if (f.o_bias && !f.qkv_bias) extra += c.model_dim;
  if (f.attention_sinks) extra += c.heads;
  if (f.qk_norm == QkNorm::PerHead) extra += 2 * c.head_dim;
  if (f.qk_norm == QkNorm::Projection) extra += q_width + kv_width;
  s.qk_norm = f.qk_norm == QkNorm::PerHead      ? QkNormKind::PerHead
              : f.qk_norm == QkNorm::Projection ? QkNormKind::Projection
                                                : QkNormKind::None;
  s.attention_extra_params = extra;
  const LatentAttentionDims& mla = f.mla;
  if (mla.enabled()) {
    s.attention = AttentionKind::Mla;
    s.q_lora_rank = checked_int(mla.q_lora_rank, "q_lora_rank", name);
    s.kv_lora_rank = checked_int(mla.kv_lora_rank, "kv_lora_rank", name);
    s.qk_nope_head_dim = checked_int(mla.qk_nope_head_dim, "qk_nope_head_dim", name);
    s.qk_rope_head_dim = checked_int(mla.qk_rope_head_dim, "qk_rope_head_dim", name);
    s.v_head_dim = checked_int(mla.v_head_dim, "v_head_dim", name);
  }
  // The shape counts dense MLP layers, wherever the model has them, as its first dense_layers blocks.
  for (int l = 0; l < c.layers; ++l) s.dense_layers += f.is_dense_mlp(l) ? 1 : 0;
  if (s.dense_layers > 0)
    s.dense_hidden = checked_int(f.dense_mlp_hidden, "dense MLP intermediate size", name);
  s.num_experts = c.moe.router.num_experts;
  s.top_k = c.moe.router.top_k;
  s.expert_hidden = checked_int(c.moe.hidden_dim, "expert intermediate size", name);
  // The families' biases come with their features (MoeTransformer sets MoeConfig's flags from them).
  s.expert_bias = f.fused_experts;
  s.router_bias = f.router == RouterKind::BiasedTopkSoftmax || c.moe.use_score_bias;
  if (c.shared_expert_hidden > 0) {
    s.shared_experts = 1;
    s.shared_hidden = checked_int(c.shared_expert_hidden, "shared expert intermediate size", name);
    s.shared_expert_gate = f.shared_expert_gate;
  }
  validate(s);
  return s;
}

}  // namespace expar
