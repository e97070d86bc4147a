// resolve_run_model: which model a training run trains, from a preset, a Hugging Face config.json or (on
// resume) its checkpoint. The resume refusals run through the binary in tests/cli/errors_test.cpp.
#include "expar/train/run_model.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/published_configs.hpp"
#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"

namespace expar {
namespace {

std::string error_of(const RunModelRequest& request) {
  try {
    resolve_run_model(request);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunModel, APresetWithItsFlags) {
  RunModelRequest r;
  r.preset = "tiny";
  r.score = "sigmoid";
  r.aux_loss_coef = 0.5;
  r.score_bias = true;
  const RunModel run = resolve_run_model(r);
  ModelConfig want = ModelConfig::preset("tiny");
  EXPECT_EQ(run.model.moe.router.num_experts, want.moe.router.num_experts);
  EXPECT_EQ(run.model.model_dim, want.model_dim);
  EXPECT_EQ(run.model.moe.router.score, ScoreFunction::Sigmoid);
  EXPECT_EQ(run.model.moe.router.aux_loss_coef, 0.5);
  EXPECT_EQ(run.model.moe.router.z_loss_coef, want.moe.router.z_loss_coef);  // not given: the preset's
  EXPECT_TRUE(run.model.moe.use_score_bias);
  EXPECT_EQ(run.format, ModelFormat::Expar);
  EXPECT_TRUE(run.model_dir.empty());
  EXPECT_TRUE(run.init_from.empty());
  EXPECT_EQ(run.label, "preset tiny");
}

TEST(RunModel, AConfigJsonIsTheModelAndItsDirectoryWithWeightsStartsTheRun) {
  test::TempDir dir("run_model");
  std::ofstream(dir / "config.json") << test::mixtral_8x7b_config().dump();
  RunModelRequest r;
  r.model = dir.path().string();
  RunModel run = resolve_run_model(r);
  EXPECT_EQ(run.format, ModelFormat::Mixtral);
  EXPECT_EQ(run.model.moe.router.num_experts, 8);
  EXPECT_EQ(run.model.model_dim, 4096);
  EXPECT_EQ(run.model_dir, dir.path());
  EXPECT_FALSE(run.hf_config_json.empty());
  EXPECT_TRUE(run.init_from.empty()) << "no weights in the directory: random initialisation";
  EXPECT_EQ(run.label, "mixtral model " + dir.path().string());

  std::ofstream(dir / "model.safetensors") << "";
  run = resolve_run_model(r);
  EXPECT_EQ(run.init_from, dir.path().string());
}

TEST(RunModel, PresetOrScoreBesideAConfigJsonIsRefusedByName) {
  test::TempDir dir("run_model");
  std::ofstream(dir / "config.json") << test::mixtral_8x7b_config().dump();
  RunModelRequest r;
  r.model = dir.path().string();
  r.preset_given = true;
  EXPECT_NE(error_of(r).find("--preset and --model both describe the model"), std::string::npos)
      << error_of(r);
  r.preset_given = false;
  r.score_given = true;
  EXPECT_NE(error_of(r).find("drop --score"), std::string::npos) << error_of(r);
  r.score_given = false;
  r.model = (dir / "missing").string();
  EXPECT_NE(error_of(r).find("does not exist"), std::string::npos) << error_of(r);
}

// DeepSeek (latent attention, dense first layers) and Qwen-MoE with dense layers are training models: their
// config.json resolves with the features that say so (tests/infer/trained_families_test.cpp trains them).
TEST(RunModel, LatentAttentionAndDenseLayersResolveWithTheirFeatures) {
  test::TempDir dir("run_model");
  std::ofstream(dir / "config.json") << nlohmann::json{{"model_type", "deepseek_v3"}}.dump();
  RunModelRequest r;
  r.model = dir.path().string();
  RunModel run = resolve_run_model(r);
  EXPECT_EQ(run.format, ModelFormat::DeepseekV3);
  EXPECT_EQ(run.features.mla.kv_lora_rank, 512);
  EXPECT_TRUE(run.features.is_dense_mlp(0));
  EXPECT_TRUE(run.model.moe.use_score_bias) << "V3's e_score_correction_bias";
  std::ofstream(dir / "config.json") << nlohmann::json{
      {"model_type", "qwen2_moe"},
      {"mlp_only_layers", {1}}}.dump();
  run = resolve_run_model(r);
  EXPECT_EQ(run.format, ModelFormat::QwenMoe);
  EXPECT_FALSE(run.features.is_dense_mlp(0));
  EXPECT_TRUE(run.features.is_dense_mlp(1));
}

}  // namespace
}  // namespace expar
