// Auxiliary-loss-free balancing in training (TrainConfig::score_bias_rate, moe/score_bias.hpp), on the
// threads backend with 4 ranks and EP 2:
//  - the bias starts at zero and moves by whole multiples of the rate, at most one per step; the first step
//    (zero bias) routes as a run without it, later steps route differently (the bias is used);
//  - rate 0 keeps the bias at zero;
//  - a run stopped and resumed from its checkpoint gives the same losses and the same final bias as an
//    uninterrupted one (the bias is saved, loaded and updated alike);
//  - the manifest names the bias only when the model has one (older manifests read as none);
//  - the settings it cannot use are refused, naming the flag (no bias in the model, a negative rate, a
//  Hugging
//    Face architecture).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/model/model_config_json.hpp"
#include "train/training_runs.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;

TrainConfig biased(int steps, double rate, const fs::path& dir) {
  TrainConfig c = testing::small_config(2, "rowwise", steps);
  c.model.moe.use_score_bias = true;
  c.score_bias_rate = rate;
  c.checkpoint_dir = dir.string();
  c.overwrite_checkpoint = true;
  return c;
}

// Every block's score bias in the newest save of `dir`, layer after layer.
std::vector<std::vector<float>> saved_biases(const fs::path& dir, int layers) {
  const SafetensorsFile dense = SafetensorsFile::open(resolve_checkpoint_dir(dir) / "dense.safetensors");
  std::vector<std::vector<float>> out;
  for (int l = 0; l < layers; ++l) {
    const Tensor t = dense.view("layers." + std::to_string(l) + ".moe.score_bias");
    out.emplace_back(t.data<float>(), t.data<float>() + t.numel());
  }
  return out;
}

class ScoreBiasTraining : public ::testing::Test {
 protected:
  const test::TempDir temp_{"score_bias"};
  const fs::path base_ = temp_.path();
};

TEST_F(ScoreBiasTraining, TheBiasMovesInStepsOfTheRateAndChangesTheRoutes) {
  const int steps = 4;
  const double rate = 0.01;
  const auto moved = testing::run_training(4, biased(steps, rate, base_ / "moved")).steps;
  const auto still = testing::run_training(4, biased(steps, 0.0, base_ / "still")).steps;
  const int layers = static_cast<int>(ModelConfig::preset("tiny").layers);
  int nonzero = 0;
  for (const auto& layer : saved_biases(base_ / "moved", layers)) {
    ASSERT_EQ(layer.size(), static_cast<size_t>(ModelConfig::preset("tiny").moe.router.num_experts));
    for (float v : layer) {
      const double k = v / rate;
      EXPECT_NEAR(k, std::round(k), 1e-3) << v << " is not a whole multiple of the rate";
      EXPECT_LE(std::abs(k), steps + 1e-3) << v << ": more than one move per step";
      nonzero += v != 0.0f;
    }
  }
  EXPECT_GT(nonzero, 0) << "no expert was above or below the mean in any block";
  for (const auto& layer : saved_biases(base_ / "still", layers))
    for (float v : layer) EXPECT_EQ(v, 0.0f) << "rate 0 must leave the bias as it is";
  ASSERT_EQ(moved.size(), still.size());
  EXPECT_EQ(moved[0].loss, still[0].loss) << "the first step routes with a zero bias";
  bool differs = false;
  for (size_t i = 1; i < moved.size(); ++i) differs = differs || moved[i].loss != still[i].loss;
  EXPECT_TRUE(differs) << "the moved bias never changed a route";
}

TEST_F(ScoreBiasTraining, ResumeKeepsTheBiasAndTheCurve) {
  const auto full = testing::run_training(4, biased(8, 0.02, base_ / "full")).steps;
  TrainConfig first = biased(8, 0.02, base_ / "split");
  first.stop_after = 4;
  const auto head = testing::run_training(4, first).steps;
  TrainConfig second = biased(8, 0.02, base_ / "split");
  second.resume_from = (base_ / "split").string();
  second.overwrite_checkpoint = false;
  const auto tail = testing::run_training(4, second).steps;
  ASSERT_EQ(full.size(), 8u);
  ASSERT_EQ(head.size(), 4u);
  ASSERT_EQ(tail.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(head[i].loss, full[i].loss) << "step " << i;
    EXPECT_NEAR(tail[i].loss, full[i + 4].loss, 1e-6 * full[i + 4].loss) << "step " << i + 4;
  }
  const int layers = static_cast<int>(ModelConfig::preset("tiny").layers);
  EXPECT_EQ(saved_biases(base_ / "split", layers), saved_biases(base_ / "full", layers));
}

TEST(ScoreBiasManifest, NamedOnlyWhenTheModelHasOne) {
  ModelConfig c = ModelConfig::preset("tiny");
  EXPECT_FALSE(model_config_to_json(c).contains("score_bias"));
  EXPECT_FALSE(model_config_from_json(model_config_to_json(c)).moe.use_score_bias);
  c.moe.use_score_bias = true;
  const nlohmann::json j = model_config_to_json(c);
  EXPECT_EQ(j.at("score_bias"), true);
  EXPECT_TRUE(model_config_from_json(j).moe.use_score_bias);
  nlohmann::json wrong = j;
  wrong["score_bias"] = "yes";
  EXPECT_THROW(model_config_from_json(wrong), Error);
}

TEST(ScoreBiasManifest, SettingsTheLoopCannotUseAreNamed) {
  auto message = [](const TrainConfig& c) {
    try {
      testing::run_training(1, c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  TrainConfig no_bias = testing::small_config(1, "local", 1);
  no_bias.score_bias_rate = 0.01;
  EXPECT_NE(message(no_bias).find("--score-bias-rate 0.01 needs a model with a score bias"),
            std::string::npos)
      << message(no_bias);
  TrainConfig negative = testing::small_config(1, "local", 1);
  negative.model.moe.use_score_bias = true;
  negative.score_bias_rate = -1;
  EXPECT_NE(message(negative).find("--score-bias-rate"), std::string::npos) << message(negative);
  TrainConfig hf = testing::small_config(1, "local", 1);
  hf.format = ModelFormat::Mixtral;
  hf.model.moe.use_score_bias = true;
  hf.score_bias_rate = 0.01;
  EXPECT_NE(message(hf).find("a score bias (--score-bias-rate) is not part of the mixtral architecture"),
            std::string::npos)
      << message(hf);
}

}  // namespace
}  // namespace expar
