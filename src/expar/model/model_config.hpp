#pragma once
// The byte-level MoE transformer language model trained by `expar train`.
#include <string>
#include <vector>

#include "expar/moe/moe_config.hpp"

namespace expar {

struct ModelConfig {
  int vocab = 256;  // bytes: no tokenizer
  int64_t model_dim = 128;
  int layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 4;
  int64_t head_dim = 32;
  int64_t max_seq = 256;
  int64_t shared_expert_hidden = 0;  // 0: no shared expert
  float norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  // The routed MoE MLP of every block (model_dim is copied from above).
  MoeConfig moe;

  // Throws expar::Error for an inconsistent configuration (names the value and the fix).
  void validate() const;
  // Named presets: "tiny" (tests), "demo" (the README's main job), "small".
  static ModelConfig preset(const std::string& name);
  // The presets' names, in order.
  static std::vector<std::string> preset_names();
};

// How a run executes a model (never saved with it): its MoE blocks' execution, and which blocks recompute
// their MoE MLP in backward (seed 000 §5.7, MoeLayer::set_recompute: those blocks keep only their MoE input,
// router state and route map in forward — the rowwise dispatch payload goes to shared scratch, no lease —
// and redo dispatch, experts and combine gather in backward; the same gradients, bit for bit).
struct ModelExecution {
  MoeExecution moe;
  std::vector<int> recompute_moe_layers;
  bool recompute_every_moe = false;  // every block, whatever the list says (expar train --recompute-moe)
  // Mixed precision (issue #35, expar train --precision bf16): the products of the experts (routed, shared,
  // dense MLP), attention's projections and the LM head multiply BF16 copies of the f32 weights by
  // BF16-rounded activations with f32 accumulation (MoeTransformer::refresh_bf16_copies makes the copies);
  // everything else stays f32. Refused with latent attention (its products are f32 only).
  bool bf16_products = false;

  // Whether block `layer`'s MoE MLP is recomputed in backward.
  bool recomputes_moe(int layer) const;
  // Throws expar::Error naming the value and the fix (MoeExecution::validate, blocks that do not exist).
  void validate(const ModelConfig& model, int ep_size) const;
};

}  // namespace expar
