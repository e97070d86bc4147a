// model_shape: the plan's shape of a config.json equals the hand-written preset of the same published model
// (topo/model_shapes.cpp, each written from its Hub config.json), parameter for parameter.
#include "expar/model/model_shape.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/published_configs.hpp"
#include "expar/model/hf_config.hpp"

namespace expar {
namespace {

using nlohmann::json;

void expect_same_shape(const json& config, const std::string& preset) {
  SCOPED_TRACE(preset);
  const ModelShape got = model_shape(hf_architecture(config, preset + "/config.json"), preset);
  const ModelShape& want = model_preset(preset);
  EXPECT_EQ(got.layers, want.layers);
  EXPECT_EQ(got.d_model, want.d_model);
  EXPECT_EQ(got.vocab, want.vocab);
  EXPECT_EQ(got.tied_embeddings, want.tied_embeddings);
  EXPECT_EQ(got.heads, want.heads);
  EXPECT_EQ(got.kv_heads, want.kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.num_experts, want.num_experts);
  EXPECT_EQ(got.top_k, want.top_k);
  EXPECT_EQ(got.expert_hidden, want.expert_hidden);
  EXPECT_EQ(got.shared_experts, want.shared_experts);
  EXPECT_EQ(attention_params_per_layer(got), attention_params_per_layer(want));
  EXPECT_EQ(one_expert_params(got), one_expert_params(want));
  EXPECT_EQ(router_params_per_layer(got), router_params_per_layer(want));
  EXPECT_EQ(total_params(got), total_params(want));
  EXPECT_EQ(active_params(got), active_params(want));
}

TEST(ModelShape, MixtralConfigGivesThePreset) {
  expect_same_shape(test::mixtral_8x7b_config(), "mixtral-8x7b");
}

TEST(ModelShape, OlmoeConfigGivesThePresetWithProjectionNorms) {
  expect_same_shape({{"model_type", "olmoe"},
                     {"hidden_size", 2048},
                     {"intermediate_size", 1024},
                     {"num_hidden_layers", 16},
                     {"num_attention_heads", 16},
                     {"num_key_value_heads", 16},
                     {"num_experts", 64},
                     {"num_experts_per_tok", 8},
                     {"vocab_size", 50304},
                     {"tie_word_embeddings", false}},
                    "olmoe-1b-7b");
}

TEST(ModelShape, Qwen3MoeConfigGivesThePresetWithPerHeadNorms) {
  expect_same_shape({{"model_type", "qwen3_moe"},
                     {"hidden_size", 2048},
                     {"moe_intermediate_size", 768},
                     {"num_hidden_layers", 48},
                     {"num_attention_heads", 32},
                     {"num_key_value_heads", 4},
                     {"head_dim", 128},
                     {"num_experts", 128},
                     {"num_experts_per_tok", 8},
                     {"vocab_size", 151936},
                     {"tie_word_embeddings", false}},
                    "qwen3-30b-a3b");
}

TEST(ModelShape, GptOssConfigGivesThePresetWithBiasesAndSinks) {
  expect_same_shape({{"model_type", "gpt_oss"},
                     {"hidden_size", 2880},
                     {"intermediate_size", 2880},
                     {"num_hidden_layers", 36},
                     {"num_attention_heads", 64},
                     {"num_key_value_heads", 8},
                     {"head_dim", 64},
                     {"num_local_experts", 128},
                     {"num_experts_per_tok", 4},
                     {"vocab_size", 201088},
                     {"tie_word_embeddings", false}},
                    "gpt-oss-120b");
}

// Qwen-MoE's shared expert and its gate, and q/k/v biases without an o bias: counted, none lost.
TEST(ModelShape, QwenMoeCountsTheSharedExpertItsGateAndTheQkvBiases) {
  const Architecture a = hf_architecture(json{{"model_type", "qwen2_moe"}}, "q2");
  const ModelShape s = model_shape(a, "qwen2-moe");
  const int64_t d = a.config.model_dim, q = a.config.heads * a.config.head_dim,
                kv = a.config.kv_heads * a.config.head_dim;
  EXPECT_EQ(s.shared_experts, 1);
  EXPECT_EQ(shared_expert_params_per_layer(s), 3 * d * a.config.shared_expert_hidden + d);
  EXPECT_FALSE(s.attention_bias);
  EXPECT_EQ(attention_params_per_layer(s), d * q + 2 * d * kv + q * d + q + 2 * kv);
}

}  // namespace
}  // namespace expar
