// Every config.json key that changes the function computed is honoured or refused, never ignored:
//  - a table of keys per family: each edit either changes the engine's logits (so the key is read), leaves
//    them bit-identical (a key that has no effect on the logits: token ids, dropout, loss terms), or is
//    refused with an expar::Error naming config.json and the key;
//  - a key expar does not know is refused by name;
//  - the same model written in the transformers v4 layout (rope_theta, rope_scaling) and the v5 layout
//    (rope_parameters) gives identical logits, for every family;
//  - numbers are validated (a zero head count is an error naming the key, not a SIGFPE).
#include <gtest/gtest.h>

#include <functional>

#include "core/expect_error.hpp"
#include "expar/infer/engine.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;
using json = nlohmann::json;

enum class Effect { Changes, Same, Refused };

HfTestModel base_model(ModelFormat f) {
  HfTestModel m = f == ModelFormat::QwenMoe    ? qwen_test_model()
                  : f == ModelFormat::Qwen3Moe ? qwen3_moe_test_model()
                  : f == ModelFormat::Olmoe    ? olmoe_test_model()
                  : f == ModelFormat::Mixtral  ? mixtral_test_model()
                                               : gpt_oss_test_model();
  return m;
}

std::vector<int32_t> prompt_of(const HfTestModel& m) {
  return vocab_tokens(11, 9, m.vocab);  // longer than every sliding window of the test models
}

// The single-rank engine's prefill logits of `prompt` for the checkpoint in `dir`; throws what it throws.
Tensor engine_logits(const fs::path& dir, const std::vector<int32_t>& prompt) {
  const ModelSpec spec = open_model_spec(dir);
  const InferenceLayout layout = make_layout(1, 1, false, std::nullopt, spec.config.moe.router.num_experts);
  Tensor out;
  MemoryTracker& host = current_tracker();
  run_ranks(1, [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, 0));
    const int id = engine.add_sequence(static_cast<int64_t>(prompt.size()));
    out = export_to(host, engine.prefill(std::vector<int>{id}, {prompt}));
  });
  return out;
}

// The model's tensors with `edit` applied to its config.json.
Tensor logits_with(const HfTestModel& m, const std::function<void(json&)>& edit, const std::string& name) {
  const fs::path dir = test::run_temp_dir(name);
  write_sharded_checkpoint(dir, m.tensors, 64 * 1024);
  json j = m.config();
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
  struct Remove {
    fs::path d;
    ~Remove() { fs::remove_all(d); }
  } remove{dir};
  return engine_logits(dir, prompt_of(m));
}

bool identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::equal(a.span<float>().begin(), a.span<float>().end(), b.span<float>().begin());
}

struct KeyCase {
  ModelFormat family;
  std::string key;  // the key the case is about (named by the error when refused)
  std::function<void(json&)> edit;
  Effect effect;
  std::function<void(json&)> baseline = {};  // compared against this edit instead of the unedited config
};

void set(json& j, const std::string& key, const json& v) {
  j[key] = v;
}

std::function<void(json&)> with(const std::string& key, json v) {
  return [key, v](json& j) { set(j, key, v); };
}

json yarn(double factor = 4.0) {
  return {{"rope_type", "yarn"}, {"factor", factor}, {"original_max_position_embeddings", 16}};
}

// gpt-oss's default YaRN (head_dim 8: its four pairs are kept, ramped and interpolated) written out with
// `key` set to `v`.
std::function<void(json&)> gpt_yarn_with(const std::string& key, json v) {
  return [key, v](json& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 32.0},
                         {"beta_fast", 32.0},   {"beta_slow", 1.0},
                         {"truncate", false},   {"original_max_position_embeddings", 4096}};
    if (!v.is_null()) j["rope_scaling"][key] = v;
  };
}

const ModelFormat Q2 = ModelFormat::QwenMoe, Q3 = ModelFormat::Qwen3Moe, OL = ModelFormat::Olmoe,
                  MX = ModelFormat::Mixtral, GO = ModelFormat::GptOss;

std::vector<KeyCase> key_cases() {
  const auto yarn_base = with("rope_scaling", yarn());
  return {
      // Shapes and counts: read (the weights no longer match, or the model is another one).
      {Q2, "hidden_size", with("hidden_size", 40), Effect::Refused},
      {Q2, "num_attention_heads", with("num_attention_heads", 6), Effect::Refused},
      {Q2, "num_key_value_heads", with("num_key_value_heads", 6), Effect::Refused},
      {Q3, "head_dim", with("head_dim", 4), Effect::Refused},
      {Q2, "vocab_size", with("vocab_size", 32), Effect::Refused},
      {Q2, "num_hidden_layers", with("num_hidden_layers", 1), Effect::Changes},
      {Q2, "num_experts", with("num_experts", 12), Effect::Refused},
      {MX, "num_local_experts", with("num_local_experts", 12), Effect::Refused},
      {Q2, "moe_intermediate_size", with("moe_intermediate_size", 6), Effect::Refused},
      {OL, "intermediate_size", with("intermediate_size", 6), Effect::Refused},
      {GO, "intermediate_size", with("intermediate_size", 6), Effect::Refused},
      {Q2, "shared_expert_intermediate_size", with("shared_expert_intermediate_size", 0), Effect::Changes},
      {Q2, "num_experts_per_tok", with("num_experts_per_tok", 2), Effect::Changes},
      {GO, "num_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = j["experts_per_token"] = 2; },
       Effect::Changes},
      {GO, "experts_per_token", with("experts_per_token", 2), Effect::Refused},              // disagrees
      {Q2, "max_position_embeddings", with("max_position_embeddings", 4), Effect::Refused},  // prompt of 9
      {Q2, "rms_norm_eps", with("rms_norm_eps", 0.5), Effect::Changes},
      {Q3, "rms_norm_eps", with("rms_norm_eps", 0.5), Effect::Changes},  // also the q/k norms'
      {OL, "rms_norm_eps", with("rms_norm_eps", 0.5), Effect::Changes},
      {Q2, "tie_word_embeddings", with("tie_word_embeddings", true), Effect::Refused},  // lm_head differs
      // Rope, v4 layout.
      {Q2, "rope_theta", with("rope_theta", 500.0), Effect::Changes},
      {Q2, "rope_scaling", with("rope_scaling", {{"rope_type", "linear"}, {"factor", 4.0}}), Effect::Changes},
      {Q2, "rope_scaling", yarn_base, Effect::Changes},
      {Q2, "type", with("rope_scaling", {{"type", "linear"}, {"factor", 4.0}}), Effect::Changes},
      {GO, "factor", gpt_yarn_with("factor", 8.0), Effect::Changes},
      {GO, "attention_factor", gpt_yarn_with("attention_factor", 1.5), Effect::Changes},
      {GO, "beta_fast", gpt_yarn_with("beta_fast", 8.0), Effect::Changes},
      {GO, "beta_slow", gpt_yarn_with("beta_slow", 2.0), Effect::Changes},
      {GO, "original_max_position_embeddings", gpt_yarn_with("original_max_position_embeddings", 512),
       Effect::Changes},
      {GO, "truncate", gpt_yarn_with("truncate", true), Effect::Changes},
      {GO, "rope_scaling", gpt_yarn_with("", nullptr), Effect::Same},  // the default, written out
      {GO, "mscale",
       [](json& j) {
         gpt_yarn_with("mscale", 1.0)(j);
         j["rope_scaling"]["mscale_all_dim"] = 0.5;
       },
       Effect::Changes},
      {OL, "high_freq_factor", [](json& j) { j["rope_scaling"]["high_freq_factor"] = 20.0; },
       Effect::Changes},
      {OL, "low_freq_factor", [](json& j) { j["rope_scaling"]["low_freq_factor"] = 0.05; }, Effect::Changes},
      {OL, "original_max_position_embeddings",
       [](json& j) { j["rope_scaling"]["original_max_position_embeddings"] = 16; }, Effect::Changes},
      {Q2, "rope_type", with("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}), Effect::Refused},
      {Q2, "rope_type", with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 2.0}}), Effect::Refused},
      {Q2, "partial_rotary_factor",
       with("rope_scaling", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}), Effect::Refused},
      {Q2, "partial_rotary_factor", with("partial_rotary_factor", 0.5), Effect::Refused},
      {Q2, "low_freq_factor",
       with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}}),
       Effect::Refused},  // a parameter the type does not take
      {Q2, "factor", with("rope_scaling", {{"rope_type", "yarn"}}), Effect::Refused},  // required
      {GO, "rope_scaling", with("rope_scaling", nullptr),
       Effect::Refused},  // v4 and v5 read null differently
      // Rope, v5 layout.
      {Q3, "rope_theta", [](json& j) { j["rope_parameters"]["rope_theta"] = 500.0; }, Effect::Changes},
      {Q3, "factor", [](json& j) { j["rope_parameters"]["factor"] = 4.0; }, Effect::Changes},
      {Q3, "rope_theta", with("rope_theta", 500.0), Effect::Refused},  // disagrees with rope_parameters
      {Q3, "rope_scaling", with("rope_scaling", {{"rope_type", "linear"}, {"factor", 3.0}}), Effect::Refused},
      {Q3, "full_attention",
       [](json& j) {
         j["rope_parameters"] = {{"full_attention", j["rope_parameters"]}};
       },
       Effect::Refused},  // per-layer-type ropes
      // Activation.
      {Q2, "hidden_act", with("hidden_act", "gelu"), Effect::Refused},
      {MX, "hidden_act", with("hidden_act", "relu"), Effect::Refused},
      {Q2, "hidden_act", with("hidden_act", "silu"), Effect::Same},
      {GO, "hidden_act", with("hidden_act", "gelu"), Effect::Same},  // gpt-oss's experts never read it
      {GO, "swiglu_limit", with("swiglu_limit", 6.0), Effect::Refused},
      {GO, "swiglu_alpha", with("swiglu_alpha", 1.5), Effect::Refused},
      // Attention.
      {Q2, "qkv_bias", with("qkv_bias", false), Effect::Changes},
      {Q3, "attention_bias", with("attention_bias", false), Effect::Changes},
      {OL, "attention_bias", with("attention_bias", true), Effect::Refused},  // no bias tensors
      {GO, "attention_bias", with("attention_bias", false), Effect::Changes},
      {OL, "clip_qkv", with("clip_qkv", 8.0), Effect::Refused},
      {OL, "head_dim", with("head_dim", 8), Effect::Refused},  // OLMoE's q norm spans hidden_size
      {MX, "sliding_window", with("sliding_window", 2), Effect::Changes},
      {MX, "sliding_window", with("sliding_window", nullptr), Effect::Changes},
      {GO, "sliding_window", with("sliding_window", 2), Effect::Changes},
      {GO, "layer_types", with("layer_types", {"full_attention", "sliding_attention"}), Effect::Changes},
      {GO, "layer_types", with("layer_types", {"full_attention"}), Effect::Refused},  // wrong length
      {Q2, "use_sliding_window",
       [](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 2;
       },
       Effect::Changes},  // layer 0 (even, below max_window_layers 28) slides
      {Q2, "max_window_layers",
       [](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 2;
         j["max_window_layers"] = 0;
       },
       Effect::Same},  // no layer below 0: none slides
      {Q2, "layer_types",
       [](json& j) {
         j["use_sliding_window"] = true;
         j["sliding_window"] = 2;
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       Effect::Changes},
      {Q3, "use_sliding_window", with("use_sliding_window", true), Effect::Refused},
      {Q3, "layer_types", with("layer_types", {"sliding_attention", "full_attention"}), Effect::Refused},
      {Q3, "layer_types", with("layer_types", {"full_attention", "full_attention"}), Effect::Same},
      {Q2, "sliding_window", with("sliding_window", 2), Effect::Same},  // use_sliding_window false
      // Router and MLP layers.
      {Q2, "norm_topk_prob", with("norm_topk_prob", true), Effect::Changes},
      {Q3, "norm_topk_prob", with("norm_topk_prob", false), Effect::Changes},
      {OL, "norm_topk_prob", with("norm_topk_prob", true), Effect::Changes},
      // Dense layers need their MLP's tensors, which these checkpoints do not have for layer 0 (the dense
      // layers are checked against the reference in hf_models_threads_test).
      {Q2, "decoder_sparse_step", with("decoder_sparse_step", 2), Effect::Refused},
      {Q3, "mlp_only_layers", with("mlp_only_layers", {0}), Effect::Refused},
      {Q3, "mlp_only_layers", with("mlp_only_layers", {2}), Effect::Refused},  // no layer 2
      {Q2, "intermediate_size", with("intermediate_size", 7),
       Effect::Same},  // dense MLP size: no dense layers
      {MX, "router_jitter_noise", with("router_jitter_noise", 0.5), Effect::Same},  // training only
      // Keys with no effect on the logits, and keys expar does not know.
      {Q2, "eos_token_id", with("eos_token_id", 3), Effect::Same},
      {GO, "attention_dropout", with("attention_dropout", 0.5), Effect::Same},
      {OL, "router_aux_loss_coef", with("router_aux_loss_coef", 0.5), Effect::Same},
      {Q2, "quantization_config", with("quantization_config", {{"quant_method", "mxfp4"}}), Effect::Refused},
      {GO, "quantization_config", with("quantization_config", {{"quant_method", "mxfp4"}}),
       Effect::Same},  // MXFP4 experts are dequantised at load; these experts are stored unquantised
      // Block-scaled FP8 (model/fp8_store.hpp): the tensors that are F8_E4M3 carry their scales; these are
      // not.
      {GO, "quantization_config", with("quantization_config", {{"quant_method", "fp8"}}), Effect::Same},
      {Q2, "quantization_config",
       with("quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}),
       Effect::Refused},
      {Q2, "quantization_config", with("quantization_config", {{"quant_method", "fp8"}, {"fmt", "e5m2"}}),
       Effect::Refused},
      {Q2, "quantization_config",
       with("quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "static"}}),
       Effect::Refused},
      {GO, "quantization_config", with("quantization_config", {{"quant_method", "mxfp4"}, {"bits", 4}}),
       Effect::Refused},
      {Q3, "use_qk_norm_v2", with("use_qk_norm_v2", true), Effect::Refused},
      {MX, "scale_embeddings", with("scale_embeddings", 2.0), Effect::Refused},
  };
}

TEST(HfConfigKeys, EveryKeyIsReadOrInertOrRefusedByName) {
  std::map<ModelFormat, HfTestModel> models;
  std::map<ModelFormat, Tensor> base;
  for (ModelFormat f : {Q2, Q3, OL, MX, GO}) {
    models[f] = base_model(f);
    base[f] = logits_with(
        models[f], [](json&) {}, "keys_base");
    // The unedited model is the dense reference's (so "changes" means a change from the right answer).
    EXPECT_TRUE(close(base[f], models[f].dense_logits(prompt_of(models[f])), 1e-4)) << model_format_name(f);
  }
  int i = 0;
  for (const KeyCase& c : key_cases()) {
    const HfTestModel& m = models[c.family];
    const std::string what =
        model_format_name(c.family) + " " + c.key + " (case " + std::to_string(i++) + ")";
    try {
      const Tensor got = logits_with(m, c.edit, "keys_case");
      const Tensor want = c.baseline ? logits_with(m, c.baseline, "keys_baseline") : base[c.family];
      EXPECT_NE(c.effect, Effect::Refused) << what << ": loaded, but should be refused";
      if (c.effect == Effect::Changes) {
        EXPECT_FALSE(close(got, want, 1e-4)) << what << ": logits unchanged";
      }
      if (c.effect == Effect::Same) {
        EXPECT_TRUE(identical(got, want)) << what << ": logits changed";
      }
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(c.effect, Effect::Refused) << what << ": refused: " << msg;
      // Config refusals name config.json and the key; weights that no longer match name both shapes.
      const bool names_key =
          msg.find("config.json") != std::string::npos && msg.find(c.key) != std::string::npos;
      const bool names_shapes = msg.find("the config does not match the weights") != std::string::npos ||
                                msg.find("max_seq") != std::string::npos ||
                                msg.find("has no tensor") != std::string::npos ||
                                msg.find("tie_word_embeddings") != std::string::npos;
      EXPECT_TRUE(names_key || names_shapes) << what << ": " << msg;
    }
  }
}

// The same model in the v4 layout (rope_theta + rope_scaling) and the v5 layout (rope_parameters with
// rope_theta inside) gives identical logits; gpt-oss's default rope written out explicitly in either layout
// gives the default's logits.
TEST(HfConfigKeys, V4AndV5LayoutsGiveIdenticalLogits) {
  for (ModelFormat f : {Q2, Q3, OL, MX, GO}) {
    HfTestModel m = base_model(f);
    m.v5 = false;
    const Tensor v4 = logits_with(
        m, [](json&) {}, "v4");
    m.v5 = true;
    const Tensor v5 = logits_with(
        m, [](json&) {}, "v5");
    EXPECT_TRUE(identical(v4, v5)) << model_format_name(f);
    EXPECT_TRUE(close(v4, m.dense_logits(prompt_of(m)), 1e-4)) << model_format_name(f);
  }
  HfTestModel g = gpt_oss_test_model();
  const Tensor by_default = logits_with(
      g, [](json&) {}, "gpt_default");
  const json rope{{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
                  {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  const Tensor v4 = logits_with(
      g, [&](json& j) { j["rope_scaling"] = rope; }, "gpt_v4");
  const Tensor v5 = logits_with(
      g,
      [&](json& j) {
        j.erase("rope_theta");
        j["rope_parameters"] = rope;
        j["rope_parameters"]["rope_theta"] = 150000.0;
      },
      "gpt_v5");
  EXPECT_TRUE(identical(by_default, v4));
  EXPECT_TRUE(identical(by_default, v5));
}

void expect_refused(const json& config, std::initializer_list<const char*> parts) {
  expect_error([&] { hf_architecture(config, "dir/config.json"); }, parts);
}

TEST(HfConfigKeys, NumbersAreValidatedNamingTheKey) {
  const json good = qwen_test_model().config();
  EXPECT_NO_THROW(hf_architecture(good, "dir/config.json"));
  auto with_value = [&](const char* key, const json& v) {
    json j = good;
    j[key] = v;
    return j;
  };
  expect_refused(with_value("num_attention_heads", 0),
                 {"dir/config.json", "num_attention_heads", "at least 1"});
  expect_refused(with_value("num_key_value_heads", -2), {"num_key_value_heads", "-2"});
  expect_refused(with_value("num_key_value_heads", 5), {"num_key_value_heads", "divide"});
  expect_refused(with_value("hidden_size", "48"), {"hidden_size", "integer"});
  expect_refused(with_value("num_hidden_layers", 2.5), {"num_hidden_layers", "integer"});
  expect_refused(with_value("num_experts_per_tok", 25), {"num_experts_per_tok", "exceeds"});
  expect_refused(with_value("rms_norm_eps", 0.0), {"rms_norm_eps", "positive"});
  expect_refused(with_value("rms_norm_eps", -1e-6), {"rms_norm_eps", "positive"});
  expect_refused(with_value("rope_theta", 1.0), {"theta"});
  expect_refused(with_value("vocab_size", 1ll << 50), {"vocab_size", "large"});
  expect_refused(with_value("norm_topk_prob", 1), {"norm_topk_prob", "true or false"});
  expect_refused(with_value("model_type", "llama"), {"llama", "not supported"});
  json no_div = good;
  no_div["num_attention_heads"] = 7;  // 48 % 7 != 0 and no head_dim
  no_div["num_key_value_heads"] = 7;
  expect_refused(no_div, {"num_attention_heads", "hidden_size"});
  json odd = good;
  odd["head_dim"] = 3;
  expect_refused(odd, {"head_dim", "even"});
  json bad_rope = good;
  bad_rope["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  expect_refused(bad_rope, {"factor", "positive"});
  bad_rope["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 0.5}};
  expect_refused(bad_rope, {"beta_fast"});
  bad_rope["rope_scaling"] = "linear";
  expect_refused(bad_rope, {"rope_scaling", "object"});
}

// A family's reference defaults apply where a key is absent (transformers' configuration_*.py).
TEST(HfConfigKeys, AbsentKeysTakeTheFamilyDefaults) {
  const Architecture q3 = hf_architecture(json{{"model_type", "qwen3_moe"}}, "q3");
  EXPECT_EQ(q3.config.vocab, 151936);
  EXPECT_EQ(q3.config.heads, 32);
  EXPECT_EQ(q3.config.kv_heads, 4);
  EXPECT_EQ(q3.config.head_dim, 64);  // hidden_size / heads
  EXPECT_EQ(q3.config.moe.router.num_experts, 128);
  EXPECT_EQ(q3.config.moe.router.top_k, 8);
  EXPECT_EQ(q3.config.moe.hidden_dim, 768);
  EXPECT_FALSE(q3.config.moe.router.renormalize);
  EXPECT_EQ(q3.features.qk_norm, QkNorm::PerHead);
  EXPECT_EQ(q3.config.rope_theta, 10000.0);
  const Architecture ol = hf_architecture(json{{"model_type", "olmoe"}}, "ol");
  EXPECT_EQ(ol.config.kv_heads, 16);  // = heads
  EXPECT_EQ(ol.config.moe.router.num_experts, 64);
  EXPECT_EQ(ol.features.qk_norm, QkNorm::Projection);
  const Architecture mx = hf_architecture(json{{"model_type", "mixtral"}}, "mx");
  EXPECT_EQ(mx.config.rope_theta, 1e6);
  EXPECT_TRUE(mx.features.window.empty());
  EXPECT_EQ(mx.config.moe.router.top_k, 2);
  const Architecture q2 = hf_architecture(json{{"model_type", "qwen2_moe"}}, "q2");
  EXPECT_EQ(q2.config.shared_expert_hidden, 5632);
  EXPECT_TRUE(q2.features.qkv_bias);
  const Architecture go = hf_architecture(json{{"model_type", "gpt_oss"}}, "go");
  EXPECT_EQ(go.config.head_dim, 64);
  EXPECT_EQ(go.config.rope_theta, 150000.0);
  EXPECT_EQ(go.features.rope.type, nn::RopeType::Yarn);
  EXPECT_EQ(go.features.window.size(), 36u);
  EXPECT_EQ(go.features.window[0], 128);
  EXPECT_EQ(go.features.window[1], 0);
}

}  // namespace
}  // namespace expar::infer
