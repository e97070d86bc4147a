#include "expar/infer/hf_config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"

namespace expar::infer {

ModelConfig mixtral_config(const std::filesystem::path& dir) {
  std::ifstream in(dir / "config.json");
  EXPAR_CHECK(in.good(), "'{}' has no config.json: pass a Hugging Face checkpoint directory", dir.string());
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string type = j.value("model_type", "");
  EXPAR_CHECK(type == "mixtral",
              "'{}': model_type '{}' is not supported end to end: the engine runs expar checkpoints and "
              "Mixtral",
              dir.string(), type);
  auto need = [&](const char* key) -> const nlohmann::json& {
    EXPAR_CHECK(j.contains(key), "'{}/config.json' has no '{}': is it a Mixtral config?", dir.string(), key);
    return j.at(key);
  };
  ModelConfig c;
  c.vocab = need("vocab_size").get<int>();
  c.model_dim = need("hidden_size").get<int64_t>();
  c.layers = need("num_hidden_layers").get<int>();
  c.heads = need("num_attention_heads").get<int64_t>();
  c.kv_heads = j.value("num_key_value_heads", c.heads);
  c.head_dim = j.value("head_dim", c.model_dim / c.heads);
  c.max_seq = need("max_position_embeddings").get<int64_t>();
  c.norm_eps = j.value("rms_norm_eps", 1e-5f);
  c.rope_theta = j.value("rope_theta", 1e6);
  c.moe.model_dim = c.model_dim;
  c.moe.num_experts = need("num_local_experts").get<int>();
  c.moe.top_k = need("num_experts_per_tok").get<int>();
  c.moe.hidden_dim = need("intermediate_size").get<int64_t>();
  c.moe.score = ScoreFunction::Softmax;
  c.moe.renormalize = true;
  return c;
}

}  // namespace expar::infer
