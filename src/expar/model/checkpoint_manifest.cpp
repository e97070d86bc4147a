#include "expar/model/checkpoint_manifest.hpp"

#include <climits>
#include <nlohmann/json.hpp>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/model/model_config_json.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kManifestMaxDepth = 8;
constexpr int64_t kMaxRanks = 1 << 20;

}  // namespace

std::string checkpoint_model_hash(const ModelConfig& model) {
  return stable_hash(model_config_to_json(model).dump());
}

CheckpointManifest read_checkpoint_manifest(const fs::path& dir) {
  CheckpointManifest m;
  m.dir = resolve_checkpoint_dir(dir);
  const fs::path path = m.dir / "manifest.json";
  m.label = path.string();
  const json j = parse_strict_json(read_text_file(path), m.label, kManifestMaxDepth);
  EXPAR_CHECK(j.is_object(), "{}: a checkpoint manifest must be a JSON object, got {}", m.label,
              json_excerpt(j));
  auto field = [&](const char* key) -> const json& {
    EXPAR_CHECK(j.contains(key), "{}: \"{}\" is missing: the manifest is damaged; use another step directory",
                m.label, key);
    return j.at(key);
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    const json& v = field(key);
    EXPAR_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
                "{}: \"{}\" is {}, not an integer in [{}, {}]: the manifest is damaged; use another step "
                "directory",
                m.label, key, json_excerpt(v), lo, hi);
    return v.get<int64_t>();
  };
  auto name = [&](const json& v, const char* what) {
    EXPAR_CHECK(v.is_string() && is_name_inside_directory(v.get<std::string>()),
                "{}: {} {} is not a file name inside the checkpoint directory: file names must be relative "
                "paths without '..'",
                m.label, what, json_excerpt(v));
    return v.get<std::string>();
  };
  const json& format = field("format");
  EXPAR_CHECK(format == kCheckpointFormat || format == kCheckpointFormatWithoutIds,
              "{}: \"format\" is {}, not {} or {}: not a checkpoint this expar reads", m.label,
              json_excerpt(format), kCheckpointFormat, kCheckpointFormatWithoutIds);
  m.step = integer("step", 0, INT_MAX);
  const json& seed = field("seed");
  EXPAR_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0),
              "{}: \"seed\" is {}, not a non-negative integer", m.label, json_excerpt(seed));
  m.seed = seed.get<uint64_t>();
  m.world = static_cast<int>(integer("world", 1, kMaxRanks));
  m.ep = static_cast<int>(integer("ep", 1, kMaxRanks));
  try {
    m.model = model_config_from_json(field("model"));
    m.model.validate();
  } catch (const Error& e) {
    fail("{}: \"model\": {}", m.label, e.what());
  }
  m.identity.step = m.step;
  if (format == kCheckpointFormat) {
    for (const char* key : {"save_id", "model_hash"})
      EXPAR_CHECK(field(key).is_string(), "{}: \"{}\" must be a string, got {}", m.label, key,
                  json_excerpt(field(key)));
    m.identity.save_id = field("save_id").get<std::string>();
    m.identity.model_hash = field("model_hash").get<std::string>();
    EXPAR_CHECK(m.identity.model_hash == checkpoint_model_hash(m.model),
                "{}: \"model_hash\" {} does not match its \"model\" (hash {}): the model config was edited; "
                "restore the manifest written with the checkpoint",
                m.label, m.identity.model_hash, checkpoint_model_hash(m.model));
  }
  if (j.contains("architecture")) {
    const json& arch = j.at("architecture");
    EXPAR_CHECK(
        arch.is_string(),
        "{}: \"architecture\" must be a string naming the model family, got {}: the manifest is damaged; "
        "use another step directory",
        m.label, json_excerpt(arch));
    try {
      m.format = model_format_from_name(arch.get<std::string>());
    } catch (const Error& e) {
      fail("{}: \"architecture\": {}", m.label, e.what());
    }
  }
  m.dense_file = name(field("dense_file"), "\"dense_file\"");
  const json& experts = field("expert_files");
  EXPAR_CHECK(experts.is_object(),
              "{}: \"expert_files\" must be an object of file name -> expert ids, got {}", m.label,
              json_excerpt(experts));
  const int num_experts = m.model.moe.router.num_experts;
  for (const auto& [file, ids] : experts.items()) {
    name(json(file), "\"expert_files\" key");
    EXPAR_CHECK(ids.is_array(), "{}: \"expert_files\".\"{}\" must be an array of expert ids, got {}", m.label,
                text_excerpt(file), json_excerpt(ids));
    for (const json& e : ids) {
      EXPAR_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < num_experts,
                  "{}: \"expert_files\".\"{}\" lists expert {}, outside [0, {}) of the model's experts",
                  m.label, text_excerpt(file), json_excerpt(e), num_experts);
      EXPAR_CHECK(m.file_of_expert.emplace(e.get<int>(), file).second,
                  "{}: expert {} is listed in two expert files: the manifest is damaged", m.label,
                  e.get<int>());
    }
  }
  return m;
}

CheckpointNames::CheckpointNames(ModelFormat format, const ModelConfig& config)
    : hf_(format != ModelFormat::Expar) {
  if (hf_) names_ = translate_weight_names(expar_weight_names(), weight_names(format), config);
}

const std::string& CheckpointNames::weight(const std::string& ours) const {
  if (!hf_) return ours;
  auto it = names_.find(ours);
  EXPAR_ASSERT(it != names_.end(), "parameter '{}' has no Hugging Face name", ours);
  return it->second;
}

}  // namespace expar
