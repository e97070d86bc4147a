// One vocabulary: a flag means one thing in every subcommand. --checkpoint is the checkpoint a command reads
// (generate, eval, serve, bench generate, bench serve) and the one train writes; --path is the execution
// path only; --top-k is sampling's (generate), routes per token are --experts-per-token; the ranks are
// --ranks. Each old spelling is refused with the new one, and the suggested command runs (the suggestion is
// applied to the refused command, not written again here). Choice lists in --help come from the registries.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::string kData = EXPAR_SOURCE_DIR "/data/kjv.txt";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string shown(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += " " + a;
  return s;
}

class FlagVocabulary : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("expar_flag_vocabulary_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const ProcessResult r = run_process(
        {EXPAR_BINARY,   "train", "--preset", "tiny", "--ranks", "1",         "--ep",         "1",
         "--path",       "local", "--steps",  "1",    "--batch", "2",         "--seq-len",    "8",
         "--eval-every", "0",     "--data",   kData,  "--log",   "/dev/null", "--checkpoint", checkpoint()},
        {}, 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string checkpoint() { return (dir_ / "run").string(); }

  // `argv` uses the old spelling `old_flag VALUE`: it is refused (status 1) with a message that says why and
  // ends in "pass NEW VALUE". Returns argv with that suggestion applied in place of the old flag and value.
  static std::vector<std::string> refused_with_fix(const std::vector<std::string>& argv,
                                                   const std::string& old_flag, const std::string& new_flag) {
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 1) << shown(argv) << "\n" << r.output;
    size_t at = 0;
    while (at < argv.size() && argv[at] != old_flag) ++at;
    EXPECT_LT(at + 1, argv.size()) << "no " << old_flag << " VALUE in" << shown(argv);
    if (at + 1 >= argv.size()) return argv;
    const std::string& value = argv[at + 1];
    EXPECT_TRUE(contains(r.output, "error: " + old_flag + " " + value + ": ")) << shown(argv) << "\n"
                                                                               << r.output;
    const std::string fix = "pass " + new_flag + " " + value;
    EXPECT_TRUE(contains(r.output, fix)) << shown(argv) << "\n" << r.output;
    // The suggestion as printed: the words after "pass " up to the end of the line.
    const size_t pass = r.output.rfind("pass ");
    const size_t end = r.output.find('\n', pass);
    const std::string printed = r.output.substr(pass + 5, end == std::string::npos ? end : end - pass - 5);
    EXPECT_EQ(printed, new_flag + " " + value) << r.output;
    std::vector<std::string> fixed = argv;
    fixed[at] = new_flag;
    return fixed;
  }

  static void expect_runs(const std::vector<std::string>& argv) {
    const ProcessResult r = run_process(argv, {}, 300);
    EXPECT_EQ(r.exit_code, 0) << shown(argv) << "\n" << r.output;
  }

  static fs::path dir_;
};

fs::path FlagVocabulary::dir_;

TEST_F(FlagVocabulary, TheCheckpointToReadIsCheckpointNotPath) {
  const std::string ckpt = checkpoint();
  const std::vector<std::vector<std::string>> commands = {
      {EXPAR_BINARY, "generate", "--path", ckpt, "--prompt", "A", "--tokens", "2"},
      {EXPAR_BINARY, "generate", "--path", ckpt, "--prompt", "A", "--tokens", "2", "--temperature", "0.5",
       "--top-k", "4"},
      {EXPAR_BINARY, "eval", "--path", ckpt, "--data", kData, "--tokens", "64"},
      {EXPAR_BINARY, "bench", "generate", "--path", ckpt, "--prompt-tokens", "4", "--tokens", "2",
       "--repeats", "1", "--warmup", "0"},
      {EXPAR_BINARY, "bench", "serve", "--path", ckpt, "--concurrency", "1", "--requests-per-client", "1",
       "--prompt-tokens", "4", "--tokens", "2"}};
  for (const auto& argv : commands) {
    const std::vector<std::string> fixed = refused_with_fix(argv, "--path", "--checkpoint");
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_TRUE(contains(r.output, "--path is the execution path")) << r.output;
    expect_runs(fixed);
  }
  // serve would keep serving: its fixed command gets as far as the layout rule, past the parser.
  const std::vector<std::string> fixed =
      refused_with_fix({EXPAR_BINARY, "serve", "--path", ckpt, "--port", "0", "--tp", "2", "--ep", "2"},
                       "--path", "--checkpoint");
  const ProcessResult r = run_process(fixed, {}, 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "error: ep_degree=2 requires expert parallelism")) << r.output;
}

TEST_F(FlagVocabulary, RoutesPerTokenAreExpertsPerToken) {
  const std::vector<std::string> plan = {EXPAR_BINARY, "plan", "--layers",        "2", "--d-model", "64",
                                         "--vocab",    "100",  "--heads",         "2", "--experts", "4",
                                         "--top-k",    "2",    "--expert-hidden", "64"};
  expect_runs(refused_with_fix(plan, "--top-k", "--experts-per-token"));
  const std::vector<std::string> payload = {
      EXPAR_BINARY, "bench",     "payload", "--ranks",        "2", "--tokens",  "16", "--d-model",
      "32",         "--experts", "4",       "--top-k",        "2", "--repeats", "1",  "--warmup",
      "0",          "--formats", "f32",     "--oversubscribe"};
  expect_runs(refused_with_fix(payload, "--top-k", "--experts-per-token"));
  // expar layer reads a file: the fixed command gets past the parser to the missing input.
  const std::vector<std::string> fixed = refused_with_fix(
      {EXPAR_BINARY, "layer", "missing.safetensors", "--out", "out.safetensors", "--top-k", "2"}, "--top-k",
      "--experts-per-token");
  const ProcessResult r = run_process(fixed, {}, 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "missing.safetensors")) << r.output;
  EXPECT_FALSE(contains(r.output, "--experts-per-token")) << r.output;
}

TEST_F(FlagVocabulary, OtherOldSpellingsAreRefusedWithTheNewOne) {
  const std::vector<std::string> plan = {EXPAR_BINARY, "plan", "--preset", "olmoe-1b-7b",
                                         "--world",    "8",    "--ep",     "4"};
  expect_runs(refused_with_fix(plan, "--world", "--ranks"));
  expect_runs(refused_with_fix({EXPAR_BINARY, "plan", "--preset", "olmoe-1b-7b", "-W", "8", "--ep", "4"},
                               "-W", "--ranks"));
  const std::vector<std::string> payload = {
      EXPAR_BINARY, "bench",     "payload", "--ranks",  "2", "--tokens",  "16",  "--experts",
      "4",          "--repeats", "1",       "--warmup", "0", "--formats", "f32", "--oversubscribe"};
  for (const auto& [old_flag, new_flag] : std::vector<std::pair<std::string, std::string>>{
           {"--d", "--d-model"}, {"--dim", "--d-model"}, {"--h", "--expert-hidden"}}) {
    std::vector<std::string> argv = payload;
    argv.insert(argv.end(), {old_flag, "32"});
    expect_runs(refused_with_fix(argv, old_flag, new_flag));
  }
  expect_runs(refused_with_fix({EXPAR_BINARY, "bench", "comm", "--backend", "threads", "--ranks", "2",
                                "--repeats", "1", "--bytes", "65536"},
                               "--backend", "--transport"));
}

TEST_F(FlagVocabulary, SamplingKeepsTopK) {
  expect_runs({EXPAR_BINARY, "generate", "--checkpoint", checkpoint(), "--prompt", "A", "--tokens", "2",
               "--temperature", "0.5", "--top-k", "4"});
}

// The choices --help lists are the registries': every checkpoint format on every command that reads one
// (serve's list once lacked qwen3-moe and olmoe), every execution path on train and layer.
TEST_F(FlagVocabulary, HelpListsComeFromTheRegistries) {
  const std::vector<std::vector<std::string>> readers = {
      {"generate"}, {"eval"}, {"serve"}, {"bench", "generate"}, {"bench", "serve"}};
  std::string first;
  for (std::vector<std::string> argv : readers) {
    argv.insert(argv.begin(), EXPAR_BINARY);
    argv.emplace_back("--help");
    const ProcessResult r = run_process(argv, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << shown(argv) << "\n" << r.output;
    for (const char* format : {"ours", "mixtral", "qwen-moe", "qwen3-moe", "olmoe", "gpt-oss"})
      EXPECT_TRUE(contains(r.output, format)) << shown(argv) << " lacks " << format << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "--checkpoint")) << r.output;
    EXPECT_FALSE(contains(r.output, "--path")) << shown(argv) << "\n" << r.output;
  }
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {EXPAR_BINARY, "train", "--help"}, {EXPAR_BINARY, "layer", "--help"}}) {
    const ProcessResult r = run_process(argv, {}, 60);
    for (const char* path : {"local", "block", "rowwise", "agrs", "aggregated"})
      EXPECT_TRUE(contains(r.output, path)) << shown(argv) << " lacks " << path << "\n" << r.output;
  }
}

}  // namespace
}  // namespace expar
