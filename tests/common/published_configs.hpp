#pragma once
// The config.json of published models, as their Hugging Face Hub repositories have them (the keys expar
// reads), for the tests that read a real model's architecture without its weights.
#include <nlohmann/json.hpp>

namespace expar::test {

// mistralai/Mixtral-8x7B-v0.1.
inline nlohmann::json mixtral_8x7b_config() {
  return {{"model_type", "mixtral"},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"num_local_experts", 8},
          {"num_experts_per_tok", 2},
          {"vocab_size", 32000},
          {"tie_word_embeddings", false},
          {"max_position_embeddings", 32768}};
}

}  // namespace expar::test
