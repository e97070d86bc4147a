#include "expar/model/model_config.hpp"

#include <algorithm>

#include "expar/core/error.hpp"

namespace expar {

void ModelConfig::validate() const {
  // Our presets are byte-level (256); a Hugging Face family's vocabulary is its config's vocab_size.
  EXPAR_CHECK(vocab >= 1 && vocab <= (1 << 24),
              "vocab={} is out of range: a vocabulary has 1 .. 16777216 tokens (token ids travel as f32 and "
              "int32)",
              vocab);
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
  moe.validate();
}

void ModelExecution::validate(const ModelConfig& model, int ep_size) const {
  moe.validate(model.moe, ep_size);
  for (size_t i = 0; i < recompute_moe_layers.size(); ++i) {
    const int l = recompute_moe_layers[i];
    EXPAR_CHECK(l >= 0 && l < model.layers,
                "recompute_moe_layers names block {} but the model has blocks 0 .. {}: list existing blocks",
                l, model.layers - 1);
    EXPAR_CHECK(std::find(recompute_moe_layers.begin(), recompute_moe_layers.begin() + static_cast<long>(i),
                          l) == recompute_moe_layers.begin() + static_cast<long>(i),
                "recompute_moe_layers lists block {} twice: list each block once", l);
  }
}

bool ModelExecution::recomputes_moe(int layer) const {
  return recompute_every_moe || std::find(recompute_moe_layers.begin(), recompute_moe_layers.end(), layer) !=
                                    recompute_moe_layers.end();
}

namespace {

struct Preset {
  const char* name;
  int64_t model_dim;
  int layers;
  int64_t heads, kv_heads, head_dim, max_seq;
  int num_experts, top_k;
  int64_t expert_hidden, shared_expert_hidden;
};

constexpr Preset kPresets[] = {
    // name    d    L  heads kv  hd  seq  E   K  h    shared
    {"tiny", 32, 2, 2, 2, 16, 64, 8, 2, 32, 16},
    {"demo", 128, 3, 4, 4, 32, 128, 16, 2, 128, 0},
    {"small", 256, 4, 8, 8, 32, 256, 32, 4, 256, 256},
};

}  // namespace

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.model_dim = p.model_dim;
    c.layers = p.layers;
    c.heads = p.heads;
    c.kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.max_seq = p.max_seq;
    c.shared_expert_hidden = p.shared_expert_hidden;
    c.moe.model_dim = p.model_dim;
    c.moe.router.num_experts = p.num_experts;
    c.moe.router.top_k = p.top_k;
    c.moe.hidden_dim = p.expert_hidden;
    c.moe.router.score = ScoreFunction::Softmax;
    c.moe.router.aux_loss_coef = 1e-2;
    c.moe.router.z_loss_coef = 1e-3;
    return c;
  }
  fail("model preset '{}' is unknown: choose {}", name, fmt::join(preset_names(), ", "));
}

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace expar
