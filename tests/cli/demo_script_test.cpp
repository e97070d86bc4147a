// scripts/demo's argument handling: the user's flags go to `expar train` and win over the script's own
// (`./scripts/demo --steps 50`, the quick look its header documents, once failed with "--steps: At Most 1
// required but received 2"). --dry-run prints the commands without set-up or build; the printed train command
// is then run for real, at a tiny size, so the test sees the binary accept what the script builds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::string kDemo = EXPAR_SOURCE_DIR "/scripts/demo";

// The printed command lines that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& output, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  return lines;
}

size_t count(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

ProcessResult dry_run(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"bash", kDemo, "--dry-run"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 60);
}

TEST(DemoScript, TheUsersStepsWin) {
  const ProcessResult r = dry_run({"--steps", "50"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto train = lines_starting(r.output, "./build/release/expar train ");
  ASSERT_EQ(train.size(), 1u) << r.output;
  EXPECT_EQ(count(train[0], "--steps"), 1u) << train[0];
  EXPECT_NE(train[0].find("--steps 50"), std::string::npos) << train[0];
  // The script's other flags stay.
  EXPECT_NE(train[0].find("--preset demo --ranks 4 --ep 4 --path rowwise"), std::string::npos) << train[0];
  // Without the user's flags the script's own 1500 steps run.
  const ProcessResult plain = dry_run({});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("--steps 1500"), std::string::npos) << plain.output;
}

TEST(DemoScript, TheUsersCheckpointIsTrainedAndSampled) {
  const ProcessResult r = dry_run({"--checkpoint=/tmp/mine", "--model", "cfg.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto train = lines_starting(r.output, "./build/release/expar train ");
  ASSERT_EQ(train.size(), 1u) << r.output;
  EXPECT_EQ(count(train[0], "--checkpoint"), 1u) << train[0];
  EXPECT_EQ(train[0].find("--preset"), std::string::npos) << "--model replaces the preset: " << train[0];
  EXPECT_EQ(r.output.find("rm -rf"), std::string::npos) << "the user's directory is not cleared\n"
                                                        << r.output;
  const auto generate = lines_starting(r.output, "./build/release/expar generate ");
  ASSERT_EQ(generate.size(), 2u) << r.output;
  for (const auto& line : generate)
    EXPECT_NE(line.find("--checkpoint /tmp/mine "), std::string::npos) << line;
}

// The printed train command runs: every flag once, the user's values used (a tiny run: 1 step of the tiny
// preset on one rank, in a scratch folder with the binary where the script expects it).
TEST(DemoScript, ThePrintedTrainCommandRuns) {
  const fs::path scratch = fs::temp_directory_path() / ("expar_demo_script_" + std::to_string(::getpid()));
  fs::remove_all(scratch);
  fs::create_directories(scratch / "build" / "release");
  fs::create_symlink(EXPAR_BINARY, scratch / "build" / "release" / "expar");
  const std::string ckpt = (scratch / "run").string();
  const ProcessResult r =
      dry_run({"--preset",     "tiny",  "--ranks",      "1", "--ep",    "1",
               "--path",       "local", "--steps",      "2", "--batch", "2",
               "--seq-len",    "8",     "--eval-every", "0", "--data",  EXPAR_SOURCE_DIR "/data/kjv.txt",
               "--checkpoint", ckpt});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto train = lines_starting(r.output, "./build/release/expar train ");
  ASSERT_EQ(train.size(), 1u) << r.output;
  const ProcessResult run = run_process({"bash", "-c", train[0]}, {}, 300, "", scratch.string());
  EXPECT_EQ(run.exit_code, 0) << train[0] << "\n" << run.output;
  EXPECT_NE(run.output.find("step    2/2"), std::string::npos) << run.output;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "latest")) << run.output;
  fs::remove_all(scratch);
}

}  // namespace
}  // namespace expar
