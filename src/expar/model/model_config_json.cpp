#include "expar/model/model_config_json.hpp"

#include "expar/core/error.hpp"

namespace expar {

nlohmann::json model_config_to_json(const ModelConfig& c) {
  nlohmann::json j{{"model_dim", c.model_dim},
                   {"layers", c.layers},
                   {"heads", c.heads},
                   {"kv_heads", c.kv_heads},
                   {"head_dim", c.head_dim},
                   {"max_seq", c.max_seq},
                   {"shared_expert_hidden", c.shared_expert_hidden},
                   {"norm_eps", c.norm_eps},
                   {"rope_theta", c.rope_theta},
                   {"num_experts", c.moe.router.num_experts},
                   {"top_k", c.moe.router.top_k},
                   {"expert_hidden", c.moe.hidden_dim},
                   {"score", score_function_name(c.moe.router.score)},
                   {"renormalize", c.moe.router.renormalize}};
  // Written only when present, so that the manifests (and config hashes) of models without one stay as they
  // were: the routing's selection bias of auxiliary-loss-free balancing, a tensor of every checkpoint.
  if (c.moe.use_score_bias) j["score_bias"] = true;
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j, const ModelConfig& base) {
  try {
    ModelConfig c = base;
    c.model_dim = j.at("model_dim");
    c.layers = j.at("layers");
    c.heads = j.at("heads");
    c.kv_heads = j.at("kv_heads");
    c.head_dim = j.at("head_dim");
    c.max_seq = j.at("max_seq");
    c.shared_expert_hidden = j.at("shared_expert_hidden");
    c.norm_eps = j.at("norm_eps");
    c.rope_theta = j.at("rope_theta");
    c.moe.model_dim = c.model_dim;
    c.moe.router.num_experts = j.at("num_experts");
    c.moe.router.top_k = j.at("top_k");
    c.moe.hidden_dim = j.at("expert_hidden");
    c.moe.router.score = score_function_from_name(j.at("score").get<std::string>());
    c.moe.router.renormalize = j.at("renormalize");
    c.moe.use_score_bias = j.contains("score_bias") && j.at("score_bias").get<bool>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("the model config in the manifest is malformed ({}): write it again with expar train", e.what());
  }
}

}  // namespace expar
