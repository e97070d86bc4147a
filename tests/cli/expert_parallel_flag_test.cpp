// Expert parallelism is opt-in for inference (seed 002, as vLLM): without --enable-expert-parallel the MoE
// layers shard every expert on the intermediate dimension over TP; with it ep_degree defaults to TP*DP;
// --ep N > 1 without it is refused naming the flag; the old --no-ep is an unknown option. Checked through
// the binary on a one-step tiny checkpoint (8 experts): the EP degree printed and written is the one of the
// layout the engine ran (GenerateResult::ep_degree, GenerateBenchReport::ep_degree), not the flags.
#include <gtest/gtest.h>

#include <filesystem>
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

class ExpertParallelFlag : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_temp_dir("ep_flag");
    const ProcessResult r =
        run_process({EXPAR_BINARY,   "train",     "--preset",     "tiny",
                     "--ranks",      "1",         "--ep",         "1",
                     "--path",       "local",     "--steps",      "1",
                     "--batch",      "2",         "--seq-len",    "8",
                     "--eval-every", "0",         "--data",       EXPAR_SOURCE_DIR "/data/kjv.txt",
                     "--log",        "/dev/null", "--checkpoint", checkpoint()},
                    {}, 300);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string checkpoint() { return (dir_ / "ckpt").string(); }

  // `expar generate` on the checkpoint with the layout flags `layout`.
  static ProcessResult generate(const std::vector<std::string>& layout) {
    std::vector<std::string> argv = {EXPAR_BINARY, "generate", "--checkpoint", checkpoint(),
                                     "--prompt",   "A",        "--tokens",     "2"};
    argv.insert(argv.end(), layout.begin(), layout.end());
    return run_process(argv, {}, 120);
  }
  // `expar bench generate --json -` on the checkpoint: the JSON it prints.
  static nlohmann::json bench_json(const std::vector<std::string>& layout) {
    std::vector<std::string> argv = {
        EXPAR_BINARY, "bench",           "generate", "--checkpoint", checkpoint(), "--json", "-", "--repeats",
        "1",          "--prompt-tokens", "4",        "--tokens",     "2"};
    argv.insert(argv.end(), layout.begin(), layout.end());
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t start = r.output.find('{');
    return start == std::string::npos ? nlohmann::json{} : nlohmann::json::parse(r.output.substr(start));
  }

  static fs::path dir_;
};

fs::path ExpertParallelFlag::dir_;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(ExpertParallelFlag, TensorParallelAloneShardsTheExpertsOverTp) {
  const ProcessResult r = generate({"--tp", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "TP 2 x DP 1, EP off,")) << r.output;
  const nlohmann::json j = bench_json({"--tp", "2"});
  EXPECT_EQ(j.value("enable_expert_parallel", true), false) << j.dump();
  EXPECT_EQ(j.value("ep_degree", 0), 1) << j.dump();
  // --ep 1 alone names the same layout: allowed.
  const ProcessResult one = generate({"--tp", "2", "--ep", "1"});
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "TP 2 x DP 1, EP off,")) << one.output;
}

TEST_F(ExpertParallelFlag, TheFlagDefaultsTheDegreeToTpTimesDp) {
  const ProcessResult r = generate({"--tp", "2", "--enable-expert-parallel"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "TP 2 x DP 1, EP 2 (full),")) << r.output;
  const ProcessResult cross =
      generate({"--tp", "2", "--dp", "2", "--enable-expert-parallel", "--oversubscribe"});
  EXPECT_EQ(cross.exit_code, 0) << cross.output;
  EXPECT_TRUE(contains(cross.output, "TP 2 x DP 2, EP 4 (full),")) << cross.output;
  const nlohmann::json j =
      bench_json({"--tp", "2", "--dp", "2", "--enable-expert-parallel", "--oversubscribe"});
  EXPECT_EQ(j.value("enable_expert_parallel", false), true) << j.dump();
  EXPECT_EQ(j.value("ep_degree", 0), 4) << j.dump();
}

// Every inference command refuses an EP degree without the flag, and the message names the flag.
TEST_F(ExpertParallelFlag, AnEpDegreeWithoutTheFlagIsRefused) {
  const std::string ckpt = checkpoint();
  const std::string data = EXPAR_SOURCE_DIR "/data/kjv.txt";
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--checkpoint", ckpt, "--prompt", "A", "--tokens", "2"},
      {"generate", "--checkpoint", ckpt, "--prompt", "A", "--tokens", "2", "--temperature", "0.5"},
      {"eval", "--checkpoint", ckpt, "--data", data, "--tokens", "64"},
      {"bench", "generate", "--checkpoint", ckpt, "--prompt-tokens", "4", "--tokens", "2"},
      {"serve", "--checkpoint", ckpt, "--port", "0"},
      {"bench", "serve", "--checkpoint", ckpt}};
  for (std::vector<std::string> argv : commands) {
    argv.insert(argv.begin(), EXPAR_BINARY);
    for (const char* flag : {"--tp", "2", "--ep", "2"}) argv.emplace_back(flag);
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 1) << argv[1] << "\n" << r.output;
    EXPECT_TRUE(
        contains(r.output, "error: ep_degree=2 requires expert parallelism: pass --enable-expert-parallel"))
        << argv[1] << "\n"
        << r.output;
  }
}

TEST_F(ExpertParallelFlag, TheOldNoEpFlagIsUnknown) {
  const std::string ckpt = checkpoint();
  const std::vector<std::vector<std::string>> commands = {{"generate", "--checkpoint", ckpt},
                                                          {"eval", "--checkpoint", ckpt},
                                                          {"bench", "generate", "--checkpoint", ckpt},
                                                          {"serve", "--checkpoint", ckpt},
                                                          {"bench", "serve", "--checkpoint", ckpt}};
  for (std::vector<std::string> argv : commands) {
    argv.insert(argv.begin(), EXPAR_BINARY);
    argv.emplace_back("--no-ep");
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 1) << argv[1] << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "The following argument was not expected: --no-ep")) << argv[1] << "\n"
                                                                                        << r.output;
  }
}

}  // namespace
}  // namespace expar
