// User mistakes that used to crash, hang or run silently wrong, each now an error with status 1 whose
// message names the flag (or file), the value and the rule (issue 18's examples, run through the binary).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::string kData = EXPAR_SOURCE_DIR "/data/kjv.txt";

std::vector<std::string> tiny_train(const std::vector<std::string>& extra, const std::string& steps = "1") {
  std::vector<std::string> argv = {EXPAR_BINARY, "train", "--preset",  "tiny",     "--ranks",      "1",
                                   "--ep",       "1",     "--path",    "local",    "--steps",      steps,
                                   "--batch",    "2",     "--seq-len", "8",        "--eval-every", "0",
                                   "--data",     kData,   "--log",     "/dev/null"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

void expect_error(const std::vector<std::string>& argv, const std::string& message,
                  const std::vector<std::pair<std::string, std::string>>& env = {}) {
  const ProcessResult r = run_process(argv, env, 120);
  std::string shown;
  for (const auto& a : argv) shown += " " + a;
  EXPECT_EQ(r.exit_code, 1) << shown << "\n" << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << shown << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << shown << "\n" << r.output;
}

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("cli_errors"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CliErrors, OptionsOutOfRange) {
  expect_error(tiny_train({"--microbatches", "0"}), "--microbatches: 0 is out of range");
  expect_error(tiny_train({"--threads", "100000"}), "--threads: 100000 is out of range");
  expect_error(tiny_train({"--lr", "-0.01"}), "--lr: -0.01 is out of range: pass a finite number in (0, 10]");
  expect_error(tiny_train({"--capacity-factor", "nan"}), "--capacity-factor: nan is out of range");
  expect_error(tiny_train({"--capacity-factor", "0", "--capacity-policy", "bogus"}),
               "--capacity-policy: 'bogus' is unknown: pass one of source, rank, expert");
  expect_error(tiny_train({"--aux-coef", "-1"}), "--aux-coef: -1 is out of range");
  expect_error(tiny_train({"--clip", "nan"}), "--clip: nan is out of range");
  expect_error(tiny_train({"--warmup", "-5"}), "--warmup: -5 is out of range");
  expect_error(tiny_train({}), "EXPAR_COMM_TIMEOUT='inf' is not a finite positive number",
               {{"EXPAR_COMM_TIMEOUT", "inf"}});
  expect_error({EXPAR_BINARY, "bench", "comm", "--bytes", "18446744073709551615"}, "--bytes: ");
  expect_error(tiny_train({"--ranks-per-node", "3"}), "--ranks-per-node 3 does not divide --ranks");
  expect_error(tiny_train({"--transport", "mpi", "--ranks-per-node", "2"}),
               "--ranks-per-node 2 with --transport mpi");
  expect_error({EXPAR_BINARY, "bench", "paths", "--ranks", "4", "--ranks-per-node", "3"},
               "--ranks-per-node 3 does not divide --ranks 4");
  expect_error(
      {EXPAR_BINARY, "layer", "x.safetensors", "--out", "x.safetensors", "--capacity-policy", "nope"},
      "--capacity-policy: 'nope' is unknown");
  expect_error({EXPAR_BINARY, "bench", "paths", "--d-model", "0"}, "--d-model: 0 is out of range");
  expect_error({EXPAR_BINARY, "bench", "comm", "--transport", "nccl"},
               "--transport: 'nccl' is unknown: pass one of threads, mpi");
}

TEST_F(CliErrors, SilentlyWrongRunsAreRefused) {
  const std::string in = (dir_ / "layer.safetensors").string();
  expect_error({EXPAR_BINARY, "layer", in, "--out", in}, "is the input file");
  expect_error(
      {EXPAR_BINARY, "plan", "--layers", "100000", "--d-model", "100000", "--vocab", "100000", "--heads",
       "1000", "--experts", "100000", "--experts-per-token", "8", "--expert-hidden", "100000"},
      "beyond the 2^62 that expar plan counts in");
}

TEST_F(CliErrors, CheckpointsAreCheckedBeforeTraining) {
  const std::string ckpt = (dir_ / "run").string();
  ProcessResult r = run_process(tiny_train({"--checkpoint", ckpt}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The checkpoint's config is the truth on resume; a contradicting flag names both values.
  expect_error(tiny_train({"--resume", ckpt, "--score", "sigmoid"}, "3"),
               "--score sigmoid contradicts the checkpoint '" + ckpt + "' (score softmax)");
  // Another model into the same directory: refused, or replaced with --overwrite.
  expect_error(tiny_train({"--checkpoint", ckpt, "--score", "sigmoid"}),
               "already holds a checkpoint of another model");
  r = run_process(tiny_train({"--checkpoint", ckpt, "--score", "sigmoid", "--overwrite"}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Unwritable: found at the start.
  expect_error(tiny_train({"--checkpoint", "/proc/expar-cannot-write-here"}), "cannot create the directory");
  // Greedy decoding beyond the model's context is refused up front, naming the limit.
  expect_error(
      {EXPAR_BINARY, "generate", "--checkpoint", ckpt, "--prompt", "And God said", "--tokens", "200"},
      "need 212 positions but the model's max_seq is 64: pass --tokens 52 or less");
  expect_error({EXPAR_BINARY, "generate", "--checkpoint", ckpt, "--temperature", "nan"},
               "--temperature: nan is out of range");
  expect_error({EXPAR_BINARY, "generate", "--checkpoint", ckpt, "--tokens", "-5"},
               "--tokens: -5 is out of range");
}

// Sampling uses --prompt-ids (bytes for our model) and prints the prompt first, then each byte.
TEST_F(CliErrors, SamplingUsesThePromptIds) {
  const std::string ckpt = (dir_ / "run").string();
  ASSERT_EQ(run_process(tiny_train({"--checkpoint", ckpt})).exit_code, 0);
  const ProcessResult r =
      run_process({EXPAR_BINARY, "generate", "--checkpoint", ckpt, "--temperature", "0.5", "--tokens", "4",
                   "--prompt-ids", "81,82", "--placement", "round-robin"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("QR", 0), 0u) << r.output;
  expect_error(
      {EXPAR_BINARY, "generate", "--checkpoint", ckpt, "--temperature", "0.5", "--prompt-ids", "300"},
      "--prompt-ids holds 300, outside the model's vocabulary [0, 256)");
}

}  // namespace
}  // namespace expar
