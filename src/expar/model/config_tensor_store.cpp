#include "expar/model/config_tensor_store.hpp"

#include <fmt/format.h>

#include "expar/core/error.hpp"
#include "expar/core/weight_view.hpp"
#include "expar/io/mxfp4.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/model/gpt_oss_layout.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

namespace {

using json = nlohmann::json;

// `text` matches the glob `pattern` ('*' any run of characters).
bool glob_matches(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return text.empty();
  if (pattern[0] == '*')
    for (size_t skip = 0; skip <= text.size(); ++skip)
      if (glob_matches(pattern.substr(1), text.substr(skip))) return true;
  return !text.empty() && pattern[0] == text[0] && pattern[0] != '*' &&
         glob_matches(pattern.substr(1), text.substr(1));
}

// The tensor `name` belongs to a module the pattern names (the module itself or one inside it).
bool in_module(const std::string& pattern, const std::string& name) {
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
    if (glob_matches(pattern, std::string_view(name).substr(0, dot))) return true;
  return false;
}

}  // namespace

StoredWeights stored_weights_of_config(const json& config, const std::string& label) {
  StoredWeights s;
  std::string dtype_key = "torch_dtype";
  const json* dtype = nullptr;
  for (const char* key : {"torch_dtype", "dtype"})
    if (config.contains(key) && !config.at(key).is_null()) {
      dtype_key = key;
      dtype = &config.at(key);
    }
  const std::string name = dtype && dtype->is_string() ? dtype->get<std::string>() : "float32";
  if (name == "float32")
    s.dtype = DType::F32;
  else if (name == "bfloat16")
    s.dtype = DType::BF16;
  else if (name == "float16")
    s.dtype = DType::F16;
  else
    fail(
        "{}: \"{}\" is {}: a plan from the config alone assumes the weights' dtype from it, and expar reads "
        "float32, bfloat16 and float16; give the checkpoint's weights (plan --model DIR with its "
        "safetensors) or correct the key",
        label, dtype_key, json_excerpt(*dtype));
  s.description = name + (dtype ? " (" + dtype_key + ")" : " (no torch_dtype: transformers' default)");
  if (config.contains("quantization_config") && config.at("quantization_config").is_object()) {
    const json& q = config.at("quantization_config");
    const std::string method = q.value("quant_method", "");
    s.mxfp4_experts = method == "mxfp4";
    s.fp8_linear = method == "fp8";
    for (const char* key : {"modules_to_not_convert", "ignored_layers"})
      if (q.contains(key) && q.at(key).is_array())
        for (const json& m : q.at(key))
          if (m.is_string()) s.unquantised_modules.push_back(m.get<std::string>());
    if (s.mxfp4_experts) s.description += ", routed experts MXFP4 (quantization_config)";
    if (s.fp8_linear)
      s.description += ", linear layers FP8 E4M3 with 128 x 128 block scales (quantization_config)";
  }
  return s;
}

void ConfigTensorStore::add(const std::string& name, Shape shape, DType dtype) {
  TensorInfo i;
  i.name = name;
  i.dtype = dtype;
  i.shape = std::move(shape);
  i.data_end = static_cast<uint64_t>(shape_numel(i.shape)) * dtype_size(dtype);
  tensors_[name] = i;
}

void ConfigTensorStore::linear(const std::string& name, Shape shape, const StoredWeights& stored) {
  bool fp8 = stored.fp8_linear;
  for (const std::string& m : stored.unquantised_modules) fp8 = fp8 && !in_module(m, name);
  if (!fp8) return add(name, std::move(shape), stored.dtype);
  const Shape grid{(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block};
  add(name, std::move(shape), DType::F8E4M3);
  add(name + "_scale_inv", grid, DType::F32);
}

ConfigTensorStore::ConfigTensorStore(std::string label, ModelFormat format, const ModelConfig& c,
                                     const ModelFeatures& f, const StoredWeights& stored)
    : label_(std::move(label)) {
  EXPAR_CHECK(format != ModelFormat::Expar,
              "'{}': an expar checkpoint is planned from its weights, not from a config alone", label_);
  const WeightNames names = weight_names(format);
  const DType dt = stored.dtype;
  const int64_t d = c.model_dim, hd = c.head_dim, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  const int64_t experts = c.moe.router.num_experts, h = c.moe.hidden_dim;
  add(names.embed, {c.vocab, d}, dt);
  if (!f.tied_embeddings) add(names.lm_head, {c.vocab, d}, dt);
  add(names.final_norm, {d}, dt);
  auto mlp = [&](const std::function<std::string(const std::string&)>& name, int64_t width) {
    linear(name("w1"), {width, d}, stored);
    linear(name("w3"), {width, d}, stored);
    linear(name("w2"), {d, width}, stored);
  };
  for (int l = 0; l < c.layers; ++l) {
    auto name = [&](const char* key) { return names.layer(l, key); };
    add(name("attn_norm"), {d}, dt);
    add(name("mlp_norm"), {d}, dt);
    const LatentAttentionDims& mla = f.mla;
    if (mla.enabled()) {
      const int64_t heads = c.heads;
      if (mla.q_lora_rank == 0) {
        linear(name("wq"), {heads * mla.qk_head_dim(), d}, stored);
      } else {
        linear(name("wq_a"), {mla.q_lora_rank, d}, stored);
        add(name("q_a_norm"), {mla.q_lora_rank}, dt);
        linear(name("wq_b"), {heads * mla.qk_head_dim(), mla.q_lora_rank}, stored);
      }
      linear(name("wkv_a"), {mla.kv_lora_rank + mla.qk_rope_head_dim, d}, stored);
      add(name("kv_a_norm"), {mla.kv_lora_rank}, dt);
      linear(name("wkv_b"), {heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank}, stored);
      linear(name("wo"), {d, heads * mla.v_head_dim}, stored);
    } else {
      linear(name("wq"), {q, d}, stored);
      linear(name("wk"), {kv, d}, stored);
      linear(name("wv"), {kv, d}, stored);
      linear(name("wo"), {d, q}, stored);
    }
    if (f.qkv_bias) {
      add(name("bq"), {q}, dt);
      add(name("bk"), {kv}, dt);
      add(name("bv"), {kv}, dt);
    }
    if (f.o_bias) add(name("bo"), {d}, dt);
    if (f.attention_sinks) add(name("sinks"), {c.heads}, dt);
    if (f.qk_norm == QkNorm::PerHead) {
      add(name("q_norm"), {hd}, dt);
      add(name("k_norm"), {hd}, dt);
    } else if (f.qk_norm == QkNorm::Projection) {
      add(name("q_norm"), {q}, dt);
      add(name("k_norm"), {kv}, dt);
    }
    if (f.is_dense_mlp(l)) {
      mlp([&](const std::string& key) { return names.dense(l, key); }, f.dense_mlp_hidden);
      continue;
    }
    add(name("router"), {experts, d}, dt);
    // DeepSeek-V3's correction bias is F32 whatever the rest, as its releases store it.
    if (c.moe.use_score_bias) add(name("score_bias"), {experts}, DType::F32);
    if (f.router == RouterKind::BiasedTopkSoftmax) add(name("router_bias"), {experts}, dt);
    if (f.fused_experts) {
      const auto stacked = gpt_oss_expert_names(l);
      for (int k = 0; k < kGptOssExpertTensors; ++k) {
        Shape shape{experts};
        const Shape one = gpt_oss_expert_shape(static_cast<GptOssExpertTensor>(k), d, h);
        shape.insert(shape.end(), one.begin(), one.end());
        const bool matrix = k == kGateUp || k == kDown;
        if (!matrix || !stored.mxfp4_experts) {
          add(stacked[static_cast<size_t>(k)], shape, dt);
          continue;
        }
        // [E, in, out] stored as blocks [E, out, in/32, 16] and scales [E, out, in/32]
        // (model/mxfp4_store.hpp).
        const int64_t in = shape[1], out = shape[2];
        EXPAR_CHECK(in % kMxfp4Block == 0,
                    "'{}': {} has {} input features, which MXFP4's blocks of {} do not divide", label_,
                    stacked[static_cast<size_t>(k)], in, kMxfp4Block);
        add(stacked[static_cast<size_t>(k)] + "_blocks", {experts, out, in / kMxfp4Block, kMxfp4Block / 2},
            DType::U8);
        add(stacked[static_cast<size_t>(k)] + "_scales", {experts, out, in / kMxfp4Block}, DType::U8);
      }
    } else {
      for (int e = 0; e < experts; ++e)
        mlp([&](const std::string& key) { return names.expert(l, e, key); }, h);
    }
    if (c.shared_expert_hidden > 0) {
      mlp([&](const std::string& key) { return names.shared(l, key); }, c.shared_expert_hidden);
      if (f.shared_expert_gate) add(names.shared(l, "gate"), {1, d}, dt);
    }
  }
}

const TensorInfo& ConfigTensorStore::info(const std::string& name) const {
  auto it = tensors_.find(name);
  EXPAR_CHECK(it != tensors_.end(), "'{}' (planned from its config alone) has no tensor '{}'", label_, name);
  return it->second;
}

Tensor ConfigTensorStore::view_rows(const std::string& name, int64_t begin, int64_t end) const {
  fail("'{}' holds only a config, no weights: tensor '{}' cannot be read; pass a checkpoint with its weights",
       label_, name);
}

}  // namespace expar
