// `expar plan --model DIR`: the model a user has, read as generate/eval/train read it. A config.json with a
// preset's published values plans exactly as the preset does; a conflicting or unsupported input is refused
// by name. Run through the binary, as a user would.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/published_configs.hpp"
#include "common/temp_dir.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

class PlanModel : public ::testing::Test {
 protected:
  fs::path write_config(const nlohmann::json& config) {
    std::ofstream(dir_ / "config.json") << config.dump(2);
    return dir_.path();
  }

  static nlohmann::json plan_json(const std::vector<std::string>& args) {
    std::vector<std::string> argv{EXPAR_BINARY, "plan"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--json", "-"});
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  }

  test::TempDir dir_{"plan_model"};
};

const nlohmann::json kMixtral8x7b = test::mixtral_8x7b_config();

TEST_F(PlanModel, AConfigJsonPlansAsItsPreset) {
  const fs::path dir = write_config(kMixtral8x7b);
  nlohmann::json from_config = plan_json({"--model", dir.string(), "--ep", "1"});
  nlohmann::json from_preset = plan_json({"--preset", "mixtral-8x7b", "--ep", "1"});
  ASSERT_TRUE(from_config.contains("model")) << from_config.dump();
  // The model's name is where it came from; every count and every per-rank figure is the same.
  from_config["model"].erase("name");
  from_preset["model"].erase("name");
  EXPECT_EQ(from_config, from_preset);
  // The directory and its config.json name the same model.
  nlohmann::json from_file = plan_json({"--model", (dir / "config.json").string(), "--ep", "1"});
  from_file["model"].erase("name");
  EXPECT_EQ(from_file, from_config);
}

TEST_F(PlanModel, PresetAndModelTogetherAreRefused) {
  const fs::path dir = write_config(kMixtral8x7b);
  const ProcessResult r =
      run_process({EXPAR_BINARY, "plan", "--preset", "mixtral-8x7b", "--model", dir.string()}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("pass one of them"), std::string::npos) << r.output;
}

TEST_F(PlanModel, AnUnsupportedModelTypeIsRefusedByName) {
  nlohmann::json llama = kMixtral8x7b;
  llama["model_type"] = "llama";
  const fs::path dir = write_config(llama);
  const ProcessResult r = run_process({EXPAR_BINARY, "plan", "--model", dir.string()}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("llama"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace expar
