#include "expar/infer/hf_config.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/model/checkpoint_manifest.hpp"

namespace expar::infer {

namespace fs = std::filesystem;

namespace {

std::string model_type_in(const fs::path& dir) {
  const nlohmann::json j = read_hf_config_json(dir);
  return j.is_object() && j.contains("model_type") && j.at("model_type").is_string()
             ? j.at("model_type").get<std::string>()
             : std::string();
}

// A save of expar train holds manifest.json and, for a Hugging Face family, config.json and that family's
// tensor names too: the manifest's "architecture" says which (absent or "ours": our own, nullopt).
std::optional<ModelFormat> family_in_manifest(const fs::path& dir) {
  const ModelFormat format = read_checkpoint_manifest(dir).format;
  return format == ModelFormat::Expar ? std::nullopt : std::optional(format);
}

}  // namespace

ModelSpec hf_model_spec(const fs::path& dir, ModelFormat format) {
  EXPAR_ASSERT(format != ModelFormat::Expar, "hf_model_spec: '{}' is a Hugging Face format only",
               model_format_name(format));
  const Architecture a = read_hf_architecture(dir, format);
  ModelSpec s;
  s.format = a.format;
  s.dir = dir;
  s.tensor_path = dir;
  s.config = a.config;
  s.features = a.features;
  return s;
}

ModelConfig mixtral_config(const fs::path& dir) {
  return hf_model_spec(dir, ModelFormat::Mixtral).config;
}

ModelSpec open_model_spec(const fs::path& given, std::optional<ModelFormat> format) {
  EXPAR_CHECK(fs::exists(given),
              "checkpoint path '{}' does not exist: pass a checkpoint directory or a file in one",
              given.string());
  // A run directory of expar train (step-<N>/ saves and a `latest` pointer) reads its newest save.
  const fs::path path =
      fs::is_directory(given) && fs::exists(given / "latest") ? resolve_checkpoint_dir(given) : given;
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
    if (ours && (!hf || (path.filename() != "config.json" && !family_in_manifest(dir)))) {
      format = ModelFormat::Expar;
    } else {
      const std::string type = model_type_in(dir);
      const auto found = format_of_model_type(type);
      EXPAR_CHECK(found.has_value(),
                  "'{}/config.json': model_type '{}' is not supported: the engine runs expar checkpoints, "
                  "mixtral, qwen2_moe (Qwen1.5/Qwen2-MoE), qwen3_moe, olmoe, gpt_oss, deepseek_v3 and "
                  "deepseek_v2",
                  dir.string(), type);
      format = found;
    }
  }
  if (*format == ModelFormat::Expar) {
    EXPAR_CHECK(ours,
                "--format ours but '{}' has no manifest.json{}: pass an expar checkpoint or the checkpoint's "
                "format",
                dir.string(),
                hf ? " (it has config.json with model_type '" + model_type_in(dir) + "')" : std::string());
    // A family's save also holds manifest.json (for --resume), but its tensors carry the family's names and
    // its architecture is config.json's: neither is what our format reads.
    if (const auto family = family_in_manifest(dir)) {
      const std::string name = model_format_name(*family);
      fail(
          "--format ours but '{}' is a {} save of expar train (its manifest.json says \"architecture\": "
          "\"{}\"): its tensors carry {}'s Hugging Face names and config.json describes its architecture, "
          "which --format ours (expar's own tensor names and manifest) does not read; pass --format {} or "
          "--format auto",
          dir.string(), name, name, name, name);
    }
    ModelSpec s;
    s.format = ModelFormat::Expar;
    s.dir = dir;
    s.tensor_path = dir;
    s.config = read_checkpoint_manifest(dir).model;
    s.features.rope.theta = s.config.rope_theta;
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
