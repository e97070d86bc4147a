#pragma once
// Which model a training run trains, from what its command line asks: one of our presets, a Hugging Face
// family's config.json (with its weights when the directory has them: fine-tuning), or, on resume, the
// checkpoint's own model (its manifest or config.json is the truth). A request that contradicts the
// checkpoint it resumes is refused with the flag to drop.
#include <filesystem>
#include <optional>
#include <string>

#include "expar/model/architecture.hpp"

namespace expar {

struct RunModelRequest {
  std::string preset = "demo";
  bool preset_given = false;  // --preset was passed (not its default)
  std::string score = "softmax";
  bool score_given = false;
  std::string model;        // a config.json or a Hugging Face checkpoint directory; empty: the preset
  std::string resume_from;  // a checkpoint (run directory or step directory); empty: a new run
  // A new run balanced by a score bias gets one (zeros); a resumed run keeps its checkpoint's, or none.
  bool score_bias = false;
  std::optional<double> aux_loss_coef, z_loss_coef;  // given: replace the model's
};

struct RunModel {
  ModelConfig model;
  ModelFormat format = ModelFormat::Expar;
  ModelFeatures features;
  std::string hf_config_json;       // the config.json text every save repeats (a Hugging Face family)
  std::string init_from;            // a Hugging Face checkpoint whose weights start the run; empty: random
  std::filesystem::path model_dir;  // the directory of the model's config.json (tokenizer); empty: a preset
  std::string label;                // "preset demo", "mixtral model DIR"
};

// Throws expar::Error naming the value, the rule and the fix.
RunModel resolve_run_model(const RunModelRequest& request);

}  // namespace expar
