#include "expar/train/run_model.hpp"

#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/io/text_file.hpp"
#include "expar/model/hf_config.hpp"
#include "expar/model/model_config_json.hpp"
#include "expar/train/checkpoint.hpp"

namespace expar {

namespace {

namespace fs = std::filesystem;

// A config.json (given, or the one in the directory given): the family, its features and the config.json
// text every save repeats; a directory with weights starts the run from them.
void read_model_architecture(RunModel& run, const fs::path& given, bool weights_start_the_run) {
  EXPAR_CHECK(fs::exists(given),
              "--model '{}' does not exist: pass a config.json or a Hugging Face "
              "checkpoint directory holding one",
              given.string());
  const fs::path file = fs::is_directory(given) ? given / "config.json" : given;
  EXPAR_CHECK(
      fs::exists(file), "--model '{}' has no config.json: pass a Hugging Face checkpoint directory{}",
      given.string(),
      fs::exists(given / "manifest.json") ? " (this is an expar checkpoint of our format: --resume it)" : "");
  const std::string text = read_text_file(file, "model config");
  const Architecture arch = hf_architecture(parse_strict_json(text, file.string(), 64), file.string());
  run.model = arch.config;
  run.format = arch.format;
  run.features = arch.features;
  run.hf_config_json = text;
  run.model_dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const bool has_weights = fs::exists(run.model_dir / std::string(kShardedIndexName)) ||
                           fs::exists(run.model_dir / "model.safetensors");
  if (weights_start_the_run && has_weights) run.init_from = run.model_dir.string();
}

// On resume: the checkpoint's model, after refusing a --score or --preset that contradicts it.
ModelConfig resumed_model(const RunModelRequest& r, const ModelConfig& requested) {
  const ModelConfig checkpoint = read_checkpoint_info(r.resume_from).model;
  const std::string& file = r.resume_from;
  if (r.score_given)
    EXPAR_CHECK(requested.moe.router.score == checkpoint.moe.router.score,
                "--score {} contradicts the checkpoint '{}' (score {}): a run resumes with its checkpoint's "
                "model; drop --score or start a new run",
                r.score, file, score_function_name(checkpoint.moe.router.score));
  if (r.preset_given) {
    ModelConfig preset = requested;
    preset.moe.router.score = checkpoint.moe.router.score;
    // A score bias is the checkpoint's to have (--score-bias-rate only moves it), as the score is.
    preset.moe.use_score_bias = checkpoint.moe.use_score_bias;
    const std::string difference = model_config_difference(preset, checkpoint);
    EXPAR_CHECK(
        difference.empty(),
        "--preset {} contradicts the checkpoint '{}' ({}): a run resumes with its checkpoint's model; "
        "drop --preset or start a new run",
        r.preset, file, difference);
  }
  // The manifest's architecture over the requested config (which keeps what a manifest does not say: the
  // router's loss coefficients).
  return model_config_from_json(model_config_to_json(checkpoint), requested);
}

}  // namespace

RunModel resolve_run_model(const RunModelRequest& r) {
  RunModel run;
  if (!r.model.empty()) {
    EXPAR_CHECK(!r.preset_given,
                "--preset and --model both describe the model: its config.json is the truth; "
                "drop --preset");
    EXPAR_CHECK(!r.score_given,
                "--score and --model both describe the model: its config.json is the truth; "
                "drop --score");
    read_model_architecture(run, r.model, r.resume_from.empty());
  } else if (!r.resume_from.empty() && read_checkpoint_info(r.resume_from).format != ModelFormat::Expar) {
    // A Hugging Face-layout save of expar train: its config.json describes the model.
    read_model_architecture(run, resolve_checkpoint_dir(r.resume_from), false);
  }
  const bool preset = run.model_dir.empty();
  if (preset) {
    run.model = ModelConfig::preset(r.preset);
    // --score is the preset's (refused with --model: a config.json says its own score function).
    run.model.moe.router.score = score_function_from_name(r.score);
    run.label = "preset " + r.preset;
  } else {
    run.label = model_format_name(run.format) + " model " + run.model_dir.string();
  }
  if (!r.resume_from.empty()) run.model = resumed_model(r, run.model);
  if (r.resume_from.empty() && r.score_bias) run.model.moe.use_score_bias = true;
  if (r.aux_loss_coef) run.model.moe.router.aux_loss_coef = *r.aux_loss_coef;
  if (r.z_loss_coef) run.model.moe.router.z_loss_coef = *r.z_loss_coef;
  return run;
}

}  // namespace expar
