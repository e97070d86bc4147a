#pragma once
// Where a checkpoint's files are and which architecture it holds (model/architecture.hpp: THE description,
// read from a manifest for ours and from config.json for the Hugging Face families by model/hf_config.hpp).
#include <filesystem>
#include <optional>

#include "expar/model/architecture.hpp"
#include "expar/model/hf_config.hpp"

namespace expar::infer {

using expar::ExpertActivation;
using expar::model_format_from_name;
using expar::model_format_name;
using expar::ModelFeatures;
using expar::ModelFormat;
using expar::QkNorm;
using expar::RouterKind;

// A checkpoint ready to load: its format, where its files are, its config and features.
struct ModelSpec {
  ModelFormat format = ModelFormat::Expar;
  std::filesystem::path dir;          // the checkpoint directory
  std::filesystem::path tensor_path;  // what the tensor store opens: `dir`, an index json or one file
  ModelConfig config;
  ModelFeatures features;
};

// `path` is a checkpoint directory or a file in one (manifest.json, config.json,
// model.safetensors.index.json or a .safetensors file), or a run directory of expar train (its `latest`
// save is read). Without `format` the format is detected
// (manifest.json: ours; config.json: its model_type); with it, files that say otherwise throw expar::Error
// naming both.
ModelSpec open_model_spec(const std::filesystem::path& path,
                          std::optional<ModelFormat> format = std::nullopt);

// dir/config.json as a ModelSpec of `format` (hf_architecture: every math-changing key honoured or refused).
ModelSpec hf_model_spec(const std::filesystem::path& dir, ModelFormat format);

// The ModelConfig of a Mixtral checkpoint directory (model_type "mixtral").
ModelConfig mixtral_config(const std::filesystem::path& dir);

}  // namespace expar::infer
