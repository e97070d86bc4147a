#include "expar/infer/hf_config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"
#include "expar/infer/tensor_store.hpp"

namespace expar::infer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormatNames = "ours, mixtral, qwen-moe, gpt-oss";

// The Hugging Face model_type of each format ("" for ours).
const char* model_type_of(ModelFormat f) {
  switch (f) {
    case ModelFormat::Mixtral:
      return "mixtral";
    case ModelFormat::QwenMoe:
      return "qwen2_moe";
    case ModelFormat::GptOss:
      return "gpt_oss";
    case ModelFormat::Expar:
      break;
  }
  return "";
}

std::optional<ModelFormat> format_of_model_type(const std::string& type) {
  for (ModelFormat f : {ModelFormat::Mixtral, ModelFormat::QwenMoe, ModelFormat::GptOss})
    if (type == model_type_of(f)) return f;
  return std::nullopt;
}

json read_config(const fs::path& dir) {
  std::ifstream in(dir / "config.json");
  EXPAR_CHECK(in.good(), "'{}' has no config.json: pass a Hugging Face checkpoint directory", dir.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("'{}/config.json' is not valid JSON ({}): pass the checkpoint's config.json", dir.string(),
         e.what());
  }
}

// Reads the fields every supported Hugging Face MoE config shares.
class ConfigReader {
 public:
  ConfigReader(const json& j, const fs::path& dir, const char* type) : j_(j), dir_(dir), type_(type) {}
  const json& need(const char* key) const {
    EXPAR_CHECK(j_.contains(key) && !j_.at(key).is_null(), "'{}/config.json' has no '{}': is it a {} config?",
                dir_.string(), key, type_);
    return j_.at(key);
  }
  template <typename T>
  T get(const char* key, T fallback) const {
    return j_.contains(key) && !j_.at(key).is_null() ? j_.at(key).get<T>() : fallback;
  }
  ModelConfig common(const char* experts_key, const char* hidden_key, double rope_theta) const {
    ModelConfig c;
    c.vocab = need("vocab_size").get<int>();
    c.model_dim = need("hidden_size").get<int64_t>();
    c.layers = need("num_hidden_layers").get<int>();
    c.heads = need("num_attention_heads").get<int64_t>();
    c.kv_heads = get<int64_t>("num_key_value_heads", c.heads);
    c.head_dim = get<int64_t>("head_dim", c.model_dim / c.heads);
    c.max_seq = need("max_position_embeddings").get<int64_t>();
    c.norm_eps = get<float>("rms_norm_eps", 1e-6f);
    c.rope_theta = get<double>("rope_theta", rope_theta);
    c.moe.model_dim = c.model_dim;
    c.moe.num_experts = need(experts_key).get<int>();
    c.moe.top_k = need("num_experts_per_tok").get<int>();
    c.moe.hidden_dim = need(hidden_key).get<int64_t>();
    c.moe.score = ScoreFunction::Softmax;
    c.moe.renormalize = true;
    EXPAR_CHECK(!j_.contains("rope_scaling") || j_.at("rope_scaling").is_null(),
                "'{}/config.json' sets rope_scaling {}: the engine applies plain RoPE only (YaRN and other "
                "scalings are not implemented); use a config without rope_scaling",
                dir_.string(), j_.contains("rope_scaling") ? j_.at("rope_scaling").dump() : "");
    return c;
  }

 private:
  const json& j_;
  const fs::path& dir_;
  const char* type_;
};

}  // namespace

std::string model_format_name(ModelFormat format) {
  switch (format) {
    case ModelFormat::Expar:
      return "ours";
    case ModelFormat::Mixtral:
      return "mixtral";
    case ModelFormat::QwenMoe:
      return "qwen-moe";
    case ModelFormat::GptOss:
      return "gpt-oss";
  }
  return "?";
}

ModelFormat model_format_from_name(const std::string& name) {
  for (ModelFormat f : {ModelFormat::Expar, ModelFormat::Mixtral, ModelFormat::QwenMoe, ModelFormat::GptOss})
    if (name == model_format_name(f)) return f;
  fail("checkpoint format '{}' is unknown: use one of {} (or auto)", name, kFormatNames);
}

ModelSpec hf_model_spec(const fs::path& dir, ModelFormat format) {
  EXPAR_CHECK(format != ModelFormat::Expar, "hf_model_spec: '{}' is a Hugging Face format only",
              model_format_name(format));
  const json j = read_config(dir);
  const std::string type = j.value("model_type", "");
  const auto found = format_of_model_type(type);
  EXPAR_CHECK(
      found == format,
      "'{}': --format {} expects config.json model_type '{}', but it says '{}'{}: pass --format {} or "
      "the right checkpoint",
      dir.string(), model_format_name(format), model_type_of(format), type,
      found ? " (" + model_format_name(*found) + ")" : std::string(" (not a supported format)"),
      found ? model_format_name(*found) : "auto");
  ModelSpec s;
  s.format = format;
  s.dir = dir;
  s.tensor_path = dir;
  const ConfigReader r(j, dir, type.c_str());
  ModelFeatures& f = s.features;
  f.tied_embeddings = r.get<bool>("tie_word_embeddings", false);
  switch (format) {
    case ModelFormat::Mixtral:
      s.config = r.common("num_local_experts", "intermediate_size", 1e6);
      s.config.norm_eps = r.get<float>("rms_norm_eps", 1e-5f);
      break;
    case ModelFormat::QwenMoe: {
      s.config = r.common("num_experts", "moe_intermediate_size", 10000.0);
      s.config.moe.renormalize = r.get<bool>("norm_topk_prob", false);
      s.config.shared_expert_hidden = r.get<int64_t>("shared_expert_intermediate_size", 0);
      const int step = r.get<int>("decoder_sparse_step", 1);
      const auto dense = r.get<std::vector<int>>("mlp_only_layers", {});
      EXPAR_CHECK(step == 1 && dense.empty(),
                  "'{}/config.json': decoder_sparse_step={} and mlp_only_layers of {} layers give dense MLP "
                  "layers, which the engine does not run: it needs every layer sparse (step 1, no "
                  "mlp_only_layers)",
                  dir.string(), step, dense.size());
      EXPAR_CHECK(!r.get<bool>("use_sliding_window", false),
                  "'{}/config.json': use_sliding_window is true: the engine runs Qwen-MoE with full "
                  "attention only; set it false",
                  dir.string());
      f.qkv_bias = true;  // Qwen2 attention: q/k/v projections with bias, o without
      f.shared_expert_gate = s.config.shared_expert_hidden > 0;
      break;
    }
    case ModelFormat::GptOss: {
      s.config = r.common("num_local_experts", "intermediate_size", 150000.0);
      s.config.norm_eps = r.get<float>("rms_norm_eps", 1e-5f);
      const double limit = r.get<double>("swiglu_limit", 7.0);
      EXPAR_CHECK(
          limit == 7.0,
          "'{}/config.json': swiglu_limit={} but the engine's clamped SwiGLU uses 7 (gpt-oss's value)",
          dir.string(), limit);
      const bool bias = r.get<bool>("attention_bias", true);
      f.qkv_bias = bias;
      f.o_bias = bias;
      f.attention_sinks = true;
      f.router = RouterKind::BiasedTopkSoftmax;
      f.activation = ExpertActivation::GptOssClamped;
      f.fused_experts = true;
      const int64_t window = r.get<int64_t>("sliding_window", 0);
      std::vector<std::string> types = r.get<std::vector<std::string>>("layer_types", {});
      if (types.empty())  // Hugging Face's default: sliding on even layers, full on odd ones
        for (int l = 0; l < s.config.layers; ++l)
          types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
      EXPAR_CHECK(static_cast<int>(types.size()) == s.config.layers,
                  "'{}/config.json': layer_types lists {} layers but num_hidden_layers is {}", dir.string(),
                  types.size(), s.config.layers);
      for (const std::string& t : types) {
        EXPAR_CHECK(t == "sliding_attention" || t == "full_attention",
                    "'{}/config.json': layer type '{}' is unknown: use sliding_attention or full_attention",
                    dir.string(), t);
        EXPAR_CHECK(t == "full_attention" || window > 0,
                    "'{}/config.json': a sliding_attention layer needs sliding_window > 0", dir.string());
        f.window.push_back(t == "sliding_attention" ? window : 0);
      }
      break;
    }
    case ModelFormat::Expar:
      break;
  }
  return s;
}

ModelConfig mixtral_config(const fs::path& dir) {
  return hf_model_spec(dir, ModelFormat::Mixtral).config;
}

ModelSpec open_model_spec(const fs::path& path, std::optional<ModelFormat> format) {
  EXPAR_CHECK(fs::exists(path),
              "checkpoint path '{}' does not exist: pass a checkpoint directory or a file in one",
              path.string());
  const bool is_dir = fs::is_directory(path);
  const fs::path dir = is_dir ? path : path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const fs::path tensors =
      is_dir || path.filename() == "config.json" || path.filename() == "manifest.json" ? dir : path;
  const bool ours = fs::exists(dir / "manifest.json"), hf = fs::exists(dir / "config.json");
  if (!format) {
    EXPAR_CHECK(ours || hf,
                "'{}' holds neither manifest.json (an expar checkpoint) nor config.json (a Hugging Face "
                "checkpoint): pass a checkpoint directory",
                dir.string());
    if (ours && (!hf || path.filename() != "config.json")) {
      format = ModelFormat::Expar;
    } else {
      const std::string type = read_config(dir).value("model_type", "");
      const auto found = format_of_model_type(type);
      EXPAR_CHECK(found.has_value(),
                  "'{}/config.json': model_type '{}' is not supported: the engine runs expar checkpoints, "
                  "mixtral, qwen2_moe (Qwen1.5/Qwen2-MoE) and gpt_oss",
                  dir.string(), type);
      format = found;
    }
  }
  if (*format == ModelFormat::Expar) {
    EXPAR_CHECK(
        ours,
        "--format ours but '{}' has no manifest.json{}: pass an expar checkpoint or the checkpoint's "
        "format",
        dir.string(),
        hf ? " (it has config.json with model_type '" + read_config(dir).value("model_type", "") + "')"
           : std::string());
    ModelSpec s;
    s.format = ModelFormat::Expar;
    s.dir = dir;
    s.tensor_path = dir;
    s.config = model_config_from_manifest(dir);
    return s;
  }
  EXPAR_CHECK(
      hf,
      "--format {} but '{}' has no config.json{}: pass a Hugging Face checkpoint directory or --format "
      "ours",
      model_format_name(*format), dir.string(), ours ? " (it is an expar checkpoint: manifest.json)" : "");
  ModelSpec s = hf_model_spec(dir, *format);
  s.tensor_path = tensors;
  return s;
}

}  // namespace expar::infer
