// `expar plan --model CONFIG --kv-tokens N` for a Hugging Face directory that holds only config.json: the
// plan from the tensors and storage the config describes (torch_dtype, quantization_config) equals, rank by
// rank and format by format, the plan read from the safetensors headers of the checkpoint the config belongs
// to: gpt-oss (BF16 with MXFP4 experts, whole and cut blocks), Mixtral in F32 (the embedding mapped),
// Qwen-MoE in BF16 (a gated shared expert), Qwen3-MoE and DeepSeek-V3 in block-scaled FP8 (the Hub's FP8
// releases as scripts/make_tiny_hf_model.py writes them), on TP, full-EP and variable-EP layouts. The plan
// says that it was made from the config; a dtype it cannot assume is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

ProcessResult run(std::vector<std::string> argv) {
  argv.insert(argv.begin(), EXPAR_BINARY);
  return run_process(argv, {}, 300);
}

nlohmann::json plan(const std::string& model, const std::vector<std::string>& layout, const fs::path& out) {
  std::vector<std::string> argv{"plan", "--model", model, "--kv-tokens", "64", "--json", out.string()};
  argv.insert(argv.end(), layout.begin(), layout.end());
  const ProcessResult r = run(argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

TEST(PlanFromConfig, EqualsThePlanOfTheCheckpointItself) {
  test::TempDir dir("plan_from_config");
  struct Case {
    std::vector<std::string> script;  // make_tiny_hf_model.py's arguments
    std::string storage;              // what the plan says it assumed
  };
  const std::vector<Case> cases{
      {{"--family", "gpt_oss", "--dtype", "bf16", "--hidden", "64", "--intermediate", "64"},
       "bfloat16 (torch_dtype), routed experts MXFP4"},
      {{"--family", "gpt_oss", "--dtype", "bf16", "--hidden", "64", "--intermediate", "32"}, "MXFP4"},
      {{"--family", "mixtral", "--dtype", "f32"}, "float32 (torch_dtype)"},
      {{"--family", "qwen2_moe", "--dtype", "bf16"}, "bfloat16 (torch_dtype)"},
      {{"--family", "qwen3_moe", "--dtype", "fp8", "--hidden", "160", "--intermediate", "96"}, "FP8 E4M3"},
      {{"--family", "deepseek_v3", "--dtype", "fp8"}, "FP8 E4M3"},
  };
  const std::vector<std::vector<std::string>> layouts{{"--tp", "1"},
                                                      {"--tp", "2"},
                                                      {"--tp", "2", "--enable-expert-parallel"},
                                                      {"--tp", "4", "--enable-expert-parallel", "--ep", "2"},
                                                      {"--tp", "2", "--dp", "2", "--enable-expert-parallel"}};
  int n = 0;
  for (const Case& c : cases) {
    const std::string what = c.script[1] + " " + c.script[3] + " #" + std::to_string(n);
    SCOPED_TRACE(what);
    const fs::path full = dir.path() / ("full" + std::to_string(n));
    const fs::path bare = dir.path() / ("bare" + std::to_string(n++));
    std::vector<std::string> argv{"python3", EXPAR_SOURCE_DIR "/scripts/make_tiny_hf_model.py", "--out",
                                  full.string()};
    argv.insert(argv.end(), c.script.begin(), c.script.end());
    const ProcessResult made = run_process(argv, {}, 300);
    ASSERT_EQ(made.exit_code, 0) << made.output;
    fs::create_directories(bare);
    fs::copy_file(full / "config.json", bare / "config.json");
    for (const std::vector<std::string>& layout : layouts) {
      std::string flags;
      for (const std::string& f : layout) flags += " " + f;
      SCOPED_TRACE(flags);
      const nlohmann::json want = plan(full.string(), layout, dir.path() / "want.json");
      // The directory, and its config.json by name.
      for (const fs::path& model : {bare, bare / "config.json"}) {
        const nlohmann::json got = plan(model.string(), layout, dir.path() / "got.json");
        EXPECT_EQ(got.at("ranks"), want.at("ranks"));
        EXPECT_EQ(got.at("process_bytes"), want.at("process_bytes"));
        EXPECT_EQ(want.at("planned_from"), "weights");
        EXPECT_EQ(got.at("planned_from"), "config");
        const std::string storage = got.value("assumed_storage", "");
        EXPECT_NE(storage.find(c.storage), std::string::npos) << storage;
      }
    }
  }
  // The table says so too.
  const ProcessResult table = run({"plan", "--model", (dir.path() / "bare0").string(), "--kv-tokens", "8"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("planned from config.json alone (no weights in the directory), stored as it "
                              "says: bfloat16 (torch_dtype), routed experts MXFP4 (quantization_config)"),
            std::string::npos)
      << table.output;
}

TEST(PlanFromConfig, ADtypeItCannotAssumeIsRefusedByName) {
  test::TempDir dir("plan_from_config_dtype");
  const fs::path full = dir.path() / "full", bare = dir.path() / "bare";
  const ProcessResult made = run_process({"python3", EXPAR_SOURCE_DIR "/scripts/make_tiny_hf_model.py",
                                          "--family", "mixtral", "--out", full.string()},
                                         {}, 300);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  std::ifstream in(full / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["torch_dtype"] = "int8";
  fs::create_directories(bare);
  std::ofstream(bare / "config.json") << config.dump(2);
  const ProcessResult r = run({"plan", "--model", bare.string(), "--kv-tokens", "8"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("\"torch_dtype\" is \"int8\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("float32, bfloat16 and float16"), std::string::npos) << r.output;
  // The fix it names: the directory with the weights.
  const ProcessResult fixed = run({"plan", "--model", full.string(), "--kv-tokens", "8"});
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
}

}  // namespace
}  // namespace expar
