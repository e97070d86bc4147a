#include "expar/model/model_config.hpp"

#include "expar/core/error.hpp"

namespace expar {

void ModelConfig::validate(int ep_size) const {
  EXPAR_CHECK(vocab == 256, "vocab={} is not supported: the model is byte-level (vocab 256)", vocab);
  EXPAR_CHECK(model_dim > 0 && layers > 0 && heads > 0 && head_dim > 0,
              "model_dim={}, layers={}, heads={}, head_dim={} must all be positive", model_dim, layers, heads,
              head_dim);
  EXPAR_CHECK(kv_heads > 0 && heads % kv_heads == 0,
              "heads={} is not divisible by kv_heads={}: choose kv_heads "
              "dividing heads",
              heads, kv_heads);
  EXPAR_CHECK(head_dim % 2 == 0, "head_dim={} must be even for rotary embeddings", head_dim);
  EXPAR_CHECK(moe.model_dim == model_dim, "moe.model_dim={} differs from model_dim={}", moe.model_dim,
              model_dim);
  moe.validate(ep_size);
}

ModelConfig ModelConfig::preset(const std::string& name) {
  ModelConfig c;
  c.moe.score = ScoreFunction::Softmax;
  c.moe.aux_loss_coef = 1e-2;
  c.moe.z_loss_coef = 1e-3;
  if (name == "tiny") {
    c.model_dim = 32;
    c.layers = 2;
    c.heads = 2;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.max_seq = 64;
    c.moe.num_experts = 8;
    c.moe.top_k = 2;
    c.moe.hidden_dim = 32;
    c.shared_expert_hidden = 16;
  } else if (name == "demo") {
    c.model_dim = 128;
    c.layers = 3;
    c.heads = 4;
    c.kv_heads = 4;
    c.head_dim = 32;
    c.max_seq = 128;
    c.moe.num_experts = 16;
    c.moe.top_k = 2;
    c.moe.hidden_dim = 128;
    c.shared_expert_hidden = 0;
  } else if (name == "small") {
    c.model_dim = 256;
    c.layers = 4;
    c.heads = 8;
    c.kv_heads = 8;
    c.head_dim = 32;
    c.max_seq = 256;
    c.moe.num_experts = 32;
    c.moe.top_k = 4;
    c.moe.hidden_dim = 256;
    c.shared_expert_hidden = 256;
  } else {
    fail("model preset '{}' is unknown: choose tiny, demo or small", name);
  }
  c.moe.model_dim = c.model_dim;
  return c;
}

}  // namespace expar
