#include "expar/model/hf_config.hpp"

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Keys that leave the logits unchanged in every family: identity and bookkeeping, token ids (generation
// only), storage dtype (expar computes in f32), training-only terms (dropout, loss coefficients).
const std::set<std::string> kNoEffect = {"architectures",
                                         "model_type",
                                         "transformers_version",
                                         "torch_dtype",
                                         "dtype",
                                         "use_cache",
                                         "bos_token_id",
                                         "eos_token_id",
                                         "pad_token_id",
                                         "_name_or_path",
                                         "initializer_range",
                                         "attention_dropout",
                                         "output_router_logits",
                                         "router_aux_loss_coef",
                                         "output_attentions",
                                         "output_hidden_states",
                                         "return_dict",
                                         "tokenizer_class",
                                         "id2label",
                                         "label2id",
                                         "auto_map",
                                         "is_encoder_decoder",
                                         "torchscript",
                                         "use_bfloat16"};

// Each family's reference defaults (transformers' configuration_<type>.py) for the shape keys.
struct Family {
  int64_t vocab, hidden, layers, heads, kv_heads, max_pos;  // kv_heads 0: = heads
  double eps, theta;
  const char* experts_key;
  int64_t experts, top_k;
  const char* expert_hidden_key;
  int64_t expert_hidden;
  int64_t head_dim;  // 0: hidden / heads
};

Family family_of(ModelFormat f) {
  switch (f) {
    case ModelFormat::Mixtral:
      return {32000, 4096, 32, 32, 8, 131072, 1e-5, 1e6, "num_local_experts", 8, 2, "intermediate_size",
              14336, 0};
    case ModelFormat::QwenMoe:
      return {151936, 2048, 24, 16, 16, 32768, 1e-6, 10000.0, "num_experts", 60, 4, "moe_intermediate_size",
              1408,   0};
    case ModelFormat::Qwen3Moe:
      return {151936, 2048, 24, 32, 4, 32768, 1e-6, 10000.0, "num_experts", 128, 8, "moe_intermediate_size",
              768,    0};
    case ModelFormat::Olmoe:
      return {50304, 2048, 16, 16, 0, 4096, 1e-5, 10000.0, "num_experts", 64, 8, "intermediate_size",
              2048,  0};
    case ModelFormat::GptOss:
      return {
          201088, 2880, 36, 64, 8, 131072, 1e-5, 150000.0, "num_local_experts", 128, 4, "intermediate_size",
          2880,   64};
    // head_dim: the rope's width, qk_rope_head_dim (read with the latent attention's keys).
    case ModelFormat::DeepseekV3:
      return {
          129280, 7168, 61, 128, 0, 4096, 1e-6, 10000.0, "n_routed_experts", 256, 8, "moe_intermediate_size",
          2048,   0};
    // DeepseekV2Config has no default expert count or top-k (None): a config must say them (0 here).
    case ModelFormat::DeepseekV2:
      return {32000, 4096, 30, 32, 0, 2048, 1e-6, 10000.0, "n_routed_experts", 0, 0, "moe_intermediate_size",
              1407,  0};
    case ModelFormat::Expar:
      break;
  }
  fail("hf_architecture: format '{}' has no Hugging Face config", model_format_name(f));
}

// Reads keys of one JSON object, remembering which were read, so that finish() can refuse the rest.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const std::string& where() const { return where_; }
  // Present and not null.
  bool has(const std::string& key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  // The value (marked read), or nullptr when absent or null.
  const json* raw(const std::string& key) {
    read_.insert(key);
    return has(key) ? &j_.at(key) : nullptr;
  }
  void no_effect(const std::string& key) { read_.insert(key); }

  [[noreturn]] void bad(const std::string& key, const std::string& rule) const {
    fail("{}: '{}' = {}: {}", where_, key, j_.contains(key) ? j_.at(key).dump() : "(absent)", rule);
  }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback, int64_t min = 1) {
    const json* v = raw(key);
    if (!v) {
      if (!fallback) fail("{}: '{}' is missing: it has no default, set it", where_, key);
      return *fallback;
    }
    if (!v->is_number_integer()) bad(key, "must be an integer");
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? INT64_MAX
                          : v->get<int64_t>();
    if (x < min) bad(key, fmt::format("must be at least {}", min));
    if (x > (int64_t{1} << 40)) bad(key, "is implausibly large (above 2^40)");
    return x;
  }
  double number(const std::string& key, std::optional<double> fallback) {
    const json* v = raw(key);
    if (!v) {
      if (!fallback) fail("{}: '{}' is missing: it has no default, set it", where_, key);
      return *fallback;
    }
    if (!v->is_number()) bad(key, "must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x)) bad(key, "must be finite");
    return x;
  }
  double positive(const std::string& key, std::optional<double> fallback) {
    const double x = number(key, fallback);
    if (!(x > 0.0)) bad(key, "must be positive");
    return x;
  }
  bool flag(const std::string& key, bool fallback) {
    const json* v = raw(key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(key, "must be true or false");
    return v->get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) {
    const json* v = raw(key);
    if (!v) return fallback;
    if (!v->is_string()) bad(key, "must be a string");
    return v->get<std::string>();
  }
  // Keys the reader neither read nor knows to leave the logits unchanged.
  void finish(const std::string& what) const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) || kNoEffect.count(key)) continue;
      fail(
          "{}: '{}' = {} is not a {} key expar knows: it may change the model's function, so it is refused "
          "rather than ignored; remove it if it has no effect on the logits",
          where_, key, value.dump(), what);
    }
  }

 private:
  const json& j_;
  std::string where_;
  std::set<std::string> read_;
};

// gpt-oss's default rope (GptOssConfig when the config has neither rope_scaling nor rope_parameters).
json gpt_oss_default_rope() {
  return json{{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
              {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
}

// One rope description: v4's rope_scaling object or v5's rope_parameters object.
nn::RopeScaling parse_rope(const json& desc, const std::string& where, int64_t max_pos, double theta) {
  if (!desc.is_object()) fail("{}: must be an object with rope_type and its parameters", where);
  for (const auto& [k, v] : desc.items())
    if (v.is_object())
      fail(
          "{}: '{}' holds a per-layer-type rope ({}): expar runs one rope for every layer; use one "
          "description",
          where, k, v.dump());
  Reader r(desc, where);
  nn::RopeScaling s;
  s.theta = theta;
  std::string type = r.text("rope_type", "");
  const std::string legacy = r.text("type", "");  // transformers' older name of rope_type
  if (!type.empty() && !legacy.empty() && type != legacy)
    r.bad("type", fmt::format("disagrees with rope_type '{}': keep one", type));
  if (type.empty()) type = legacy.empty() ? "default" : legacy;
  r.no_effect("rope_theta");  // read by the caller
  if (r.has("partial_rotary_factor") && r.number("partial_rotary_factor", 1.0) != 1.0)
    r.bad("partial_rotary_factor", "expar rotates the whole head (partial_rotary_factor 1 only)");
  r.no_effect("partial_rotary_factor");
  if (type == "default") {
    s.type = nn::RopeType::Default;
  } else if (type == "linear") {
    s.type = nn::RopeType::Linear;
    s.factor = r.positive("factor", std::nullopt);
  } else if (type == "yarn") {
    s.type = nn::RopeType::Yarn;
    s.factor = r.positive("factor", std::nullopt);
    s.original_max_position_embeddings = r.integer("original_max_position_embeddings", max_pos);
    // transformers: `beta_fast or 32`, `beta_slow or 1`
    s.beta_fast = r.number("beta_fast", 32.0);
    if (s.beta_fast == 0.0) s.beta_fast = 32.0;
    s.beta_slow = r.number("beta_slow", 1.0);
    if (s.beta_slow == 0.0) s.beta_slow = 1.0;
    s.truncate = r.flag("truncate", true);
    const json* af = r.raw("attention_factor");
    const double mscale = r.number("mscale", 0.0), mscale_all = r.number("mscale_all_dim", 0.0);
    if (af) {
      s.attention_factor = r.positive("attention_factor", std::nullopt);
    } else if (mscale != 0.0 && mscale_all != 0.0) {
      // DeepSeek's form of the default attention factor, as transformers computes it.
      auto m = [&](double k) { return s.factor <= 1.0 ? 1.0 : 0.1 * k * std::log(s.factor) + 1.0; };
      s.attention_factor = m(mscale) / m(mscale_all);
    }
  } else if (type == "llama3") {
    s.type = nn::RopeType::Llama3;
    s.factor = r.positive("factor", std::nullopt);
    s.original_max_position_embeddings = r.integer("original_max_position_embeddings", std::nullopt);
    s.low_freq_factor = r.positive("low_freq_factor", std::nullopt);
    s.high_freq_factor = r.positive("high_freq_factor", std::nullopt);
  } else {
    r.bad(desc.contains("rope_type") ? "rope_type" : "type",
          "this rope type is not implemented: expar runs default, linear, yarn and llama3");
  }
  r.finish("rope (" + type + ")");
  try {
    s.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return s;
}

bool same_rope(const nn::RopeScaling& a, const nn::RopeScaling& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.attention_factor == b.attention_factor && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.truncate == b.truncate && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor;
}

// Theta and the rope type from either layout (v4: rope_theta + rope_scaling; v5: rope_parameters).
nn::RopeScaling read_rope(Reader& r, const json& j, ModelFormat format, const Family& fam, int64_t max_pos) {
  const json* params = r.raw("rope_parameters");
  const json* scaling = r.raw("rope_scaling");
  // NaN: absent (std::optional trips GCC's maybe-uninitialized here).
  const double top = r.has("rope_theta") ? r.number("rope_theta", std::nullopt) : std::nan("");
  const bool has_top = !std::isnan(top);
  r.no_effect("rope_theta");
  const std::string where = r.where();
  if (params) {
    double theta = has_top ? top : fam.theta;
    if (params->is_object() && params->contains("rope_theta")) {
      Reader pr(*params, where + " rope_parameters");
      theta = pr.number("rope_theta", std::nullopt);
      if (has_top && top != theta)
        r.bad("rope_theta", fmt::format("disagrees with rope_parameters.rope_theta = {}: keep one", theta));
    }
    const nn::RopeScaling s = parse_rope(*params, where + " rope_parameters", max_pos, theta);
    if (scaling && !same_rope(s, parse_rope(*scaling, where + " rope_scaling", max_pos, theta)))
      r.bad("rope_scaling", "describes another rope than rope_parameters: keep one");
    return s;
  }
  const double theta = has_top ? top : fam.theta;
  if (scaling) return parse_rope(*scaling, where + " rope_scaling", max_pos, theta);
  if (format == ModelFormat::GptOss) {
    // Absent, gpt-oss takes YaRN (GptOssConfig's default in v4 and v5). An explicit null is read as plain
    // RoPE by transformers v4 but as the YaRN default by v5, so it is refused rather than guessed.
    if (j.contains("rope_scaling"))
      r.bad("rope_scaling",
            "null means plain RoPE to transformers v4 but gpt-oss's default YaRN to v5: write the rope "
            "explicitly (rope_scaling or rope_parameters), or remove the key for the YaRN default");
    return parse_rope(gpt_oss_default_rope(), where + " (gpt-oss default rope)", max_pos, theta);
  }
  nn::RopeScaling s;
  s.theta = theta;
  try {
    s.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return s;
}

// layer_types: every entry "full_attention" or "sliding_attention".
std::vector<std::string> read_layer_types(Reader& r, int layers) {
  std::vector<std::string> types;
  const json* v = r.raw("layer_types");
  if (!v) return types;
  if (!v->is_array()) r.bad("layer_types", "must be a list of 'full_attention' / 'sliding_attention'");
  for (const json& t : *v) {
    if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
      r.bad("layer_types", fmt::format("entry {} is not 'full_attention' or 'sliding_attention'", t.dump()));
    types.push_back(t.get<std::string>());
  }
  if (static_cast<int>(types.size()) != layers)
    r.bad("layer_types", fmt::format("lists {} layers but num_hidden_layers is {}", types.size(), layers));
  return types;
}

// YaRN's mscale_all_dim from whichever rope description the config has (0: none). DeepSeek's attention
// multiplies its softmax scale by mscale(factor, mscale_all_dim)² (transformers' DeepseekV3Attention).
double mscale_squared(const json& j, const nn::RopeScaling& rope) {
  if (rope.type != nn::RopeType::Yarn) return 1.0;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || !j.at(key).is_object()) continue;
    const json& desc = j.at(key);
    if (!desc.contains("mscale_all_dim") || !desc.at("mscale_all_dim").is_number()) return 1.0;
    const double all = desc.at("mscale_all_dim").get<double>();
    if (all == 0.0 || rope.factor <= 1.0) return 1.0;
    const double m = 0.1 * all * std::log(rope.factor) + 1.0;
    return m * m;
  }
  return 1.0;
}

void check_activation(Reader& r);

// DeepSeek-V2/V3: latent attention, the router, shared experts and dense layers.
void read_deepseek(Reader& r, const json& j, ModelFormat format, ModelConfig& c, ModelFeatures& f) {
  const bool v3 = format == ModelFormat::DeepseekV3;
  check_activation(r);
  if (r.flag("attention_bias", false))
    r.bad("attention_bias", "latent attention with projection biases is not implemented: use false");
  if (r.flag("mlp_bias", false)) r.bad("mlp_bias", "MLPs with biases are not implemented: use false");
  if (c.kv_heads != c.heads)
    r.bad("num_key_value_heads",
          fmt::format("latent attention derives a key and a value per query head: it must equal "
                      "num_attention_heads = {}",
                      c.heads));
  LatentAttentionDims& a = f.mla;
  const json* q_lora = r.raw("q_lora_rank");
  a.q_lora_rank = q_lora ? r.integer("q_lora_rank", std::nullopt) : (j.contains("q_lora_rank") ? 0 : 1536);
  a.kv_lora_rank = r.integer("kv_lora_rank", 512);
  a.qk_nope_head_dim = r.integer("qk_nope_head_dim", 128);
  a.qk_rope_head_dim = r.integer("qk_rope_head_dim", 64);
  a.v_head_dim = r.integer("v_head_dim", 128);
  if (a.qk_rope_head_dim % 2 != 0) r.bad("qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  if (r.has("head_dim") && r.integer("head_dim", std::nullopt) != a.qk_rope_head_dim)
    r.bad("head_dim",
          fmt::format("is the rope's width here and must equal qk_rope_head_dim = {}", a.qk_rope_head_dim));
  r.no_effect("head_dim");
  if (r.has("qk_head_dim") && r.integer("qk_head_dim", std::nullopt) != a.qk_head_dim())
    r.bad("qk_head_dim", fmt::format("must equal qk_nope_head_dim + qk_rope_head_dim = {}", a.qk_head_dim()));
  r.no_effect("qk_head_dim");
  c.head_dim = a.qk_rope_head_dim;
  // V3 reads rope_interleave; V2's rope is always the complex-number form, which pairs (2i, 2i + 1) too.
  a.rope_interleave = v3 ? r.flag("rope_interleave", true) : true;
  if (!v3) r.no_effect("rope_interleave");
  a.softmax_scale = mscale_squared(j, f.rope) / std::sqrt(static_cast<double>(a.qk_head_dim()));

  MoeConfig& m = c.moe;
  RouterConfig& router = m.router;
  router.routed_scale = r.positive("routed_scaling_factor", v3 ? 2.5 : 1.0);
  router.renormalize = r.flag("norm_topk_prob", v3);
  const std::string scoring = r.text("scoring_func", v3 ? "sigmoid" : "softmax");
  const std::string method = r.text("topk_method", v3 ? "noaux_tc" : "greedy");
  const int64_t n_group = r.has("n_group") ? r.integer("n_group", std::nullopt) : (v3 ? 8 : 1);
  const int64_t topk_group = r.has("topk_group") ? r.integer("topk_group", std::nullopt) : (v3 ? 4 : 1);
  if (v3) {
    if (scoring != "sigmoid")
      r.bad("scoring_func",
            "DeepSeek-V3's router scores with sigmoid (noaux_tc); other functions are not run");
    if (method != "noaux_tc")
      r.bad("topk_method", "DeepSeek-V3's router selects with noaux_tc (a selection-only correction bias)");
    router.score = ScoreFunction::Sigmoid;
    m.use_score_bias = true;  // mlp.gate.e_score_correction_bias
  } else {
    if (scoring != "softmax") r.bad("scoring_func", "DeepSeek-V2's router scores with softmax");
    if (method != "greedy" && method != "group_limited_greedy")
      r.bad("topk_method", "DeepSeek-V2's router selects with greedy or group_limited_greedy");
    router.score = ScoreFunction::Softmax;
  }
  const bool grouped = v3 || method == "group_limited_greedy";
  router.n_group = grouped ? static_cast<int>(n_group) : 1;  // greedy ignores the groups
  router.topk_group = grouped ? static_cast<int>(topk_group) : 1;
  if (grouped) {
    if (router.num_experts % router.n_group != 0)
      r.bad("n_group", fmt::format("must divide n_routed_experts = {}", router.num_experts));
    if (router.topk_group > router.n_group) r.bad("topk_group", fmt::format("exceeds n_group = {}", n_group));
    if (router.top_k > router.topk_group * (router.num_experts / router.n_group))
      r.bad("num_experts_per_tok", "exceeds the experts of the topk_group groups a token may choose from");
  }
  const json* shared = r.raw("n_shared_experts");
  const int64_t n_shared = shared ? r.integer("n_shared_experts", std::nullopt, 0) : (v3 ? 1 : 0);
  c.shared_expert_hidden = n_shared * m.hidden_dim;  // one SwiGLU MLP of n_shared experts' width, ungated

  // Dense MLP layers: the first first_k_dense_replace, and those off moe_layer_freq (DeepSeek's own code and
  // vLLM: a layer is MoE when l >= first_k_dense_replace and l % moe_layer_freq == 0).
  const int64_t first_dense = r.integer("first_k_dense_replace", v3 ? 3 : 0, 0);
  const int64_t freq = r.integer("moe_layer_freq", 1);
  f.dense_mlp.assign(static_cast<size_t>(c.layers), 0);
  for (int l = 0; l < c.layers; ++l) f.dense_mlp[static_cast<size_t>(l)] = l < first_dense || l % freq != 0;
  f.dense_mlp_hidden = r.integer("intermediate_size", v3 ? 18432 : 11008);

  // The multi-token-prediction layers follow the num_hidden_layers layers in the checkpoint; generation
  // does not use them (transformers skips them alike).
  f.ignored_mtp_layers = static_cast<int>(r.integer("num_nextn_predict_layers", 0, 0));
  // The router's load-balancing loss when training (no effect on the logits): DeepSeek's sequence-wise one
  // with coefficient aux_loss_alpha (seq_aux true, their configs' default), or its batch-wise one,
  // α·E·Σ_e f_e·P_e = α·K times the router's batch form E/K·Σ_e f_e·P_e (moe/router.hpp). `expar train
  // --aux-coef` replaces the coefficient (run_model.cpp).
  const double alpha = r.number("aux_loss_alpha", 0.001);
  if (alpha < 0.0) r.bad("aux_loss_alpha", "must not be negative");
  const bool seq_aux = r.flag("seq_aux", true);
  router.aux_loss_kind = seq_aux ? AuxLossKind::Sequence : AuxLossKind::Batch;
  router.aux_loss_coef = seq_aux ? alpha : alpha * static_cast<double>(router.top_k);
  // The authors' parallel layout, and pretraining_tp (which splits the products into slices with the same
  // result).
  for (const char* key : {"ep_size", "pretraining_tp"}) r.no_effect(key);
}

void read_qwen_dense_layers(Reader& r, int layers, ModelFeatures& f, int64_t default_intermediate);

// Qwen2/Qwen3-MoE attention windows and dense layers. Qwen2-MoE's sliding windows follow Qwen2MoeConfig
// today; Qwen3-MoE's are refused (its config does not say which layers slide).
void read_qwen_common(Reader& r, int layers, ModelFeatures& f, int64_t default_intermediate, bool qwen2) {
  const bool sliding = r.flag("use_sliding_window", false);
  if (sliding && !qwen2)
    r.bad("use_sliding_window",
          "expar runs Qwen3-MoE with full attention only (its config says no layer's window); set it false");
  std::vector<std::string> types = read_layer_types(r, layers);
  if (!sliding) {
    r.no_effect("sliding_window");     // unused while use_sliding_window is false
    r.no_effect("max_window_layers");  // likewise
    for (const std::string& t : types)
      if (t != "full_attention")
        r.bad("layer_types",
              "a sliding_attention layer needs use_sliding_window true (else its window is 0)");
    read_qwen_dense_layers(r, layers, f, default_intermediate);
    return;
  }
  // Qwen2-MoE with sliding windows, as Qwen2MoeConfig lays them out today: layer_types when given, else
  // sliding on the even layers below max_window_layers (transformers releases before it differed).
  const int64_t window = r.integer("sliding_window", 4096);
  const int64_t below = r.integer("max_window_layers", 28, 0);
  if (types.empty())
    for (int l = 0; l < layers; ++l)
      types.push_back((l + 1) % 2 != 0 && l < below ? "sliding_attention" : "full_attention");
  for (const std::string& t : types) f.window.push_back(t == "sliding_attention" ? window : 0);
  read_qwen_dense_layers(r, layers, f, default_intermediate);
}

// Qwen2/Qwen3-MoE dense MLP layers: those mlp_only_layers lists and (l + 1) % decoder_sparse_step != 0.
void read_qwen_dense_layers(Reader& r, int layers, ModelFeatures& f, int64_t default_intermediate) {
  const int64_t step = r.integer("decoder_sparse_step", 1);
  std::vector<uint8_t> dense(static_cast<size_t>(layers), 0);
  if (const json* only = r.raw("mlp_only_layers")) {
    if (!only->is_array()) r.bad("mlp_only_layers", "must be a list of layer indices");
    for (const json& l : *only) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers)
        r.bad("mlp_only_layers", fmt::format("entry {} is not a layer index in [0, {})", l.dump(), layers));
      dense[static_cast<size_t>(l.get<int64_t>())] = 1;
    }
  }
  bool any = false;
  for (int l = 0; l < layers; ++l) {
    if ((l + 1) % step != 0) dense[static_cast<size_t>(l)] = 1;
    any = any || dense[static_cast<size_t>(l)] != 0;
  }
  const int64_t hidden = r.integer("intermediate_size", default_intermediate);  // the dense MLP's width
  if (any) {
    f.dense_mlp = std::move(dense);
    f.dense_mlp_hidden = hidden;
  }
}

void check_activation(Reader& r) {
  const std::string act = r.text("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    r.bad("hidden_act",
          "expar's experts compute SwiGLU with silu (silu / swish); other activations are not "
          "implemented");
}

}  // namespace

json read_hf_config_json(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  EXPAR_CHECK(fs::is_regular_file(file), "'{}' has no config.json: pass a Hugging Face checkpoint directory",
              dir.string());
  std::ifstream in(file, std::ios::binary);
  EXPAR_CHECK(in.good(), "'{}' cannot be read: check its permissions", file.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Strict: a key written twice would otherwise silently keep its last value.
  return parse_strict_json(text, fmt::format("'{}'", file.string()), 16);
}

Architecture hf_architecture(const json& j, const std::string& label, std::optional<ModelFormat> expected) {
  EXPAR_CHECK(j.is_object(), "'{}' is not a JSON object: pass a Hugging Face config.json", label);
  const std::string type = j.contains("model_type") && j.at("model_type").is_string()
                               ? j.at("model_type").get<std::string>()
                               : std::string();
  const std::optional<ModelFormat> found = format_of_model_type(type);
  if (expected && *expected != ModelFormat::Expar) {
    EXPAR_CHECK(
        found == expected,
        "'{}': --format {} expects model_type '{}', but it says '{}'{}: pass --format {} or the right "
        "checkpoint",
        label, model_format_name(*expected), hf_model_type(*expected), type,
        found ? " (" + model_format_name(*found) + ")" : std::string(" (not a supported format)"),
        found ? model_format_name(*found) : "auto");
  }
  EXPAR_CHECK(found.has_value(),
              "'{}': model_type '{}' is not supported: expar runs mixtral, qwen2_moe (Qwen1.5/Qwen2-MoE), "
              "qwen3_moe, olmoe, gpt_oss, deepseek_v3 and deepseek_v2",
              label, type);
  const ModelFormat format = *found;
  const Family fam = family_of(format);
  Reader r(j, "'" + label + "'");
  if (const json* q = r.raw("quantization_config")) {
    // gpt-oss's MXFP4 experts are dequantised at load (model/mxfp4_store.hpp); nothing else is quantised.
    bool mxfp4 = format == ModelFormat::GptOss && q->is_object() && q->contains("quant_method") &&
                 q->at("quant_method") == "mxfp4";
    if (mxfp4)
      for (const auto& [key, value] : q->items())
        mxfp4 = mxfp4 && (key == "quant_method" || key == "modules_to_not_convert");
    // Block-scaled FP8 as DeepSeek-V3 and Qwen3's FP8 releases store it (F8_E4M3 weights and F32
    // weight_scale_inv per 128 × 128 block; model/fp8_store.hpp), activations quantised dynamically by
    // their kernels (expar keeps them f32, which only makes the products more exact).
    auto is = [&](const char* key, const json& want, bool optional) {
      return q->contains(key) ? q->at(key) == want : optional;
    };
    bool fp8 = q->is_object() && is("quant_method", "fp8", false) && is("fmt", "e4m3", true) &&
               is("activation_scheme", "dynamic", true) &&
               is("weight_block_size", json::array({128, 128}), true);
    if (fp8)
      for (const auto& [key, value] : q->items())
        fp8 =
            fp8 && (key == "quant_method" || key == "fmt" || key == "activation_scheme" ||
                    key == "weight_block_size" || key == "modules_to_not_convert" || key == "ignored_layers");
    if (!mxfp4 && !fp8)
      r.bad("quantization_config",
            "expar loads gpt-oss's MXFP4 experts ({\"quant_method\": \"mxfp4\", "
            "\"modules_to_not_convert\": [...]}) and block-scaled FP8 ({\"quant_method\": \"fp8\", "
            "\"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}); "
            "dequantise other checkpoints to BF16 or F32 and remove quantization_config");
  }

  Architecture a;
  a.format = format;
  ModelConfig& c = a.config;
  ModelFeatures& f = a.features;
  c.vocab = static_cast<int>(r.integer("vocab_size", fam.vocab));
  c.model_dim = r.integer("hidden_size", fam.hidden);
  c.layers = static_cast<int>(r.integer("num_hidden_layers", fam.layers));
  c.heads = r.integer("num_attention_heads", fam.heads);
  c.kv_heads = r.integer("num_key_value_heads", fam.kv_heads > 0 ? fam.kv_heads : c.heads);
  if (c.heads % c.kv_heads != 0)
    r.bad("num_key_value_heads",
          fmt::format("must divide num_attention_heads = {} (grouped-query attention)", c.heads));
  const bool deepseek = format == ModelFormat::DeepseekV3 || format == ModelFormat::DeepseekV2;
  if (!deepseek && !r.has("head_dim") && fam.head_dim == 0 && c.model_dim % c.heads != 0)
    r.bad("num_attention_heads",
          fmt::format(
              "must divide hidden_size = {} when head_dim is not given (head_dim = hidden_size / heads)",
              c.model_dim));
  if (!deepseek) {  // DeepSeek: the rope's width, read with the latent attention
    c.head_dim = r.integer("head_dim", fam.head_dim > 0 ? fam.head_dim : c.model_dim / c.heads);
    if (c.head_dim % 2 != 0) r.bad("head_dim", "must be even (RoPE rotates pairs)");
  }
  c.max_seq = r.integer("max_position_embeddings", fam.max_pos);
  c.norm_eps = static_cast<float>(r.positive("rms_norm_eps", fam.eps));
  f.tied_embeddings = r.flag("tie_word_embeddings", false);
  f.rope = read_rope(r, j, format, fam, c.max_seq);
  c.rope_theta = f.rope.theta;

  MoeConfig& m = c.moe;
  m.model_dim = c.model_dim;
  auto fallback = [](int64_t v) { return v > 0 ? std::optional<int64_t>(v) : std::nullopt; };
  m.router.num_experts = static_cast<int>(r.integer(fam.experts_key, fallback(fam.experts)));
  m.router.top_k = static_cast<int>(r.integer("num_experts_per_tok", fallback(fam.top_k)));
  if (m.router.top_k > m.router.num_experts)
    r.bad("num_experts_per_tok", fmt::format("exceeds the {} experts", m.router.num_experts));
  m.hidden_dim = r.integer(fam.expert_hidden_key, fam.expert_hidden);
  m.router.score = ScoreFunction::Softmax;
  m.router.renormalize = true;

  switch (format) {
    case ModelFormat::Mixtral: {
      check_activation(r);
      r.no_effect("router_jitter_noise");  // training only (multiplicative noise on the router input)
      const json* w = r.raw("sliding_window");
      if (w) {
        const int64_t window = r.integer("sliding_window", std::nullopt);
        f.window.assign(static_cast<size_t>(c.layers), window);  // MixtralAttention: every layer
      }
      break;
    }
    case ModelFormat::QwenMoe:
      check_activation(r);
      m.router.renormalize = r.flag("norm_topk_prob", false);
      c.shared_expert_hidden = r.integer("shared_expert_intermediate_size", 5632, 0);
      f.shared_expert_gate = c.shared_expert_hidden > 0;
      f.qkv_bias = r.flag("qkv_bias", true);  // v5's key; v4's Qwen2-MoE always has q/k/v biases
      read_qwen_common(r, c.layers, f, 5632, true);
      break;
    case ModelFormat::Qwen3Moe: {
      check_activation(r);
      m.router.renormalize = r.flag("norm_topk_prob", false);
      const bool bias = r.flag("attention_bias", false);
      f.qkv_bias = f.o_bias = bias;
      f.qk_norm = QkNorm::PerHead;
      read_qwen_common(r, c.layers, f, 6144, false);
      break;
    }
    case ModelFormat::Olmoe: {
      check_activation(r);
      m.router.renormalize = r.flag("norm_topk_prob", false);
      const bool bias = r.flag("attention_bias", false);
      f.qkv_bias = f.o_bias = bias;
      f.qk_norm = QkNorm::Projection;
      if (c.heads * c.head_dim != c.model_dim)
        r.bad("head_dim",
              fmt::format("OLMoE's q norm spans hidden_size = {}, so heads x head_dim must equal it",
                          c.model_dim));
      if (r.has("clip_qkv"))
        r.bad("clip_qkv", "clipping q/k/v is not implemented: expar runs OLMoE with clip_qkv null");
      r.no_effect("clip_qkv");
      break;
    }
    case ModelFormat::GptOss: {
      r.no_effect("hidden_act");              // unused: gpt-oss's experts always run the clamped SwiGLU
      r.no_effect("initial_context_length");  // unused by the model (the rope carries the context length)
      if (r.has("experts_per_token") && r.integer("experts_per_token", std::nullopt) != m.router.top_k)
        r.bad("experts_per_token",
              fmt::format("disagrees with num_experts_per_tok = {}: keep one", m.router.top_k));
      r.no_effect("experts_per_token");
      if (r.number("swiglu_limit", 7.0) != 7.0)
        r.bad("swiglu_limit", "expar's clamped SwiGLU clamps at 7 (gpt-oss's value)");
      if (r.number("swiglu_alpha", 1.702) != 1.702)
        r.bad("swiglu_alpha", "expar's clamped SwiGLU uses alpha 1.702 (gpt-oss's value)");
      const bool bias = r.flag("attention_bias", true);
      f.qkv_bias = f.o_bias = bias;
      f.attention_sinks = true;
      f.router = RouterKind::BiasedTopkSoftmax;
      c.moe.router.softmax_over_topk = true;
      f.activation = ExpertActivation::GptOssClamped;
      f.fused_experts = true;
      // null: no window (transformers' sliding layers then see everything), refused below if a layer slides
      const bool null_window = j.contains("sliding_window") && j.at("sliding_window").is_null();
      const int64_t win = null_window ? 0 : r.integer("sliding_window", 128);
      std::vector<std::string> types = read_layer_types(r, c.layers);
      if (types.empty())  // GptOssConfig's default: sliding on even layers, full on odd ones
        for (int l = 0; l < c.layers; ++l)
          types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
      for (const std::string& t : types) {
        if (t == "sliding_attention" && win <= 0)
          r.bad("sliding_window", "a sliding_attention layer needs sliding_window > 0");
        f.window.push_back(t == "sliding_attention" ? win : 0);
      }
      break;
    }
    case ModelFormat::DeepseekV3:
    case ModelFormat::DeepseekV2:
      read_deepseek(r, j, format, c, f);
      break;
    case ModelFormat::Expar:
      break;
  }
  r.finish(hf_model_type(format));
  return a;
}

Architecture read_hf_architecture(const fs::path& dir, std::optional<ModelFormat> expected) {
  return hf_architecture(read_hf_config_json(dir), (dir / "config.json").string(), expected);
}

}  // namespace expar
