#pragma once
// ModelConfig <-> JSON, as stored under "model" in a checkpoint's manifest.json (written by training,
// read by training's resume and by the inference engine).
#include <nlohmann/json.hpp>

#include "expar/model/model_config.hpp"

namespace expar {

nlohmann::json model_config_to_json(const ModelConfig& config);
// The fields model_config_to_json writes are taken from `j`, every other field from `base` (e.g. a preset's
// loss coefficients). Throws expar::Error naming the missing or malformed field.
ModelConfig model_config_from_json(const nlohmann::json& j, const ModelConfig& base = ModelConfig{});

}  // namespace expar
