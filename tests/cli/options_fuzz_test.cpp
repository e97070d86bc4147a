// Every option of every subcommand, given extreme or malformed values: expar exits 0, or 1 with an
// "error:" message; never a signal (SIGFPE, SIGSEGV, abort), never another status. The options are read
// from each command's --help, so options added later are covered without editing this test. Each command
// runs from a tiny base invocation (one step, a few tokens) in a scratch directory; the fuzzed option
// replaces the base's value when the base has it. EXPAR_FUZZ_VALUES (default 3) sets how many values each
// option gets (drawn with a fixed seed from the list below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::vector<std::string> kValues = {"0",
                                          "-1",
                                          "-5",
                                          "nan",
                                          "inf",
                                          "-inf",
                                          "1e308",
                                          "18446744073709551615",
                                          "9223372036854775808",
                                          "2147483648",
                                          "100000",
                                          "",
                                          "abc",
                                          "0.5",
                                          "1e-300"};

// Options that take a path: fuzzing them only makes files with odd names, and the base needs their value.
bool is_path_option(const std::string& flag) {
  for (const char* p : {"--data", "--log", "--checkpoint", "--resume", "--json", "--svg", "--out", "--path"})
    if (flag == p) return true;
  return false;
}

// "--flag" of every option with a value in `help`: CLI11's "  [-x,]--name[,-y] TYPE ..." lines. (Parsed by
// hand: std::regex trips GCC 12's maybe-uninitialized warning under the sanitizer build.)
std::vector<std::string> options_with_values(const std::string& help) {
  std::vector<std::string> out;
  std::istringstream in(help);
  for (std::string l; std::getline(in, l);) {
    const size_t start = l.find_first_not_of(' ');
    if (start == std::string::npos || start == 0) continue;
    std::istringstream words(l.substr(start));
    std::string names, type;
    words >> names >> type;
    const size_t dashes = names.find("--");
    if (dashes == std::string::npos || type.empty() || !std::isupper(static_cast<unsigned char>(type[0])))
      continue;
    std::string flag = names.substr(dashes);
    flag = flag.substr(0, flag.find(','));
    if (flag != "--help") out.push_back(flag);
  }
  return out;
}

struct Command {
  std::vector<std::string> words;  // {"bench", "comm"}
  std::vector<std::string> base;   // a quick valid invocation's options
};

class OptionsFuzz : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = test::make_temp_dir("options_fuzz");
    // A checkpoint for generate.
    ProcessResult r =
        run_process({EXPAR_BINARY,   "train",     "--preset",     "tiny",
                     "--ranks",      "1",         "--ep",         "1",
                     "--path",       "local",     "--steps",      "1",
                     "--batch",      "2",         "--seq-len",    "8",
                     "--eval-every", "0",         "--data",       EXPAR_SOURCE_DIR "/data/kjv.txt",
                     "--log",        "/dev/null", "--checkpoint", (scratch_ / "ckpt").string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(scratch_); }
  static fs::path scratch_;
};
fs::path OptionsFuzz::scratch_;

std::vector<Command> commands(const fs::path& scratch) {
  const std::string data = EXPAR_SOURCE_DIR "/data/kjv.txt";
  const std::vector<std::string> tiny_moe = {"--tokens",  "16", "--experts", "4", "--experts-per-token", "2",
                                             "--repeats", "1",  "--warmup",  "0", "--oversubscribe"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  return {
      {{"train"}, {"--preset",     "tiny",    "--ranks", "1",       "--ep",  "1",         "--path",
                   "local",        "--steps", "1",       "--batch", "2",     "--seq-len", "8",
                   "--eval-every", "0",       "--data",  data,      "--log", "/dev/null"}},
      {{"generate"}, {"--checkpoint", (scratch / "ckpt").string(), "--tokens", "2", "--prompt", "A"}},
      {{"plan"}, {"--preset", "olmoe-1b-7b", "--ranks", "8", "--ep", "8"}},
      {{"layer"}, {"missing.safetensors", "--out", "out.safetensors"}},
      {{"bench", "comm"}, {"--transport", "threads", "--ranks", "2", "--repeats", "1", "--bytes", "65536"}},
      {{"bench", "paths"},
       with({"--ranks", "2", "--d-model", "32", "--expert-hidden", "32", "--no-memory"}, tiny_moe)},
      {{"bench", "payload"}, with({"--ranks", "2", "--d-model", "32"}, tiny_moe)},
      {{"bench", "waves"},
       with({"--ranks", "2", "--d-model", "32", "--expert-hidden", "32", "--waves", "2"}, tiny_moe)},
      {{"bench", "bar"}, with({"--d-model", "32", "--expert-hidden", "32"}, tiny_moe)},
      {{"bench", "scaling"},
       with({"--d-model", "32", "--expert-hidden", "32", "--ep-list", "2", "--tokens-list", "16"}, tiny_moe)},
  };
}

TEST_F(OptionsFuzz, ExtremeValuesEndWithStatusZeroOrAnError) {
  const char* env = std::getenv("EXPAR_FUZZ_VALUES");
  const size_t per_option = env ? static_cast<size_t>(std::atoi(env)) : 3;
  std::mt19937 rng(2026);
  int runs = 0;
  for (const Command& c : commands(scratch_)) {
    std::vector<std::string> help_argv = {EXPAR_BINARY};
    help_argv.insert(help_argv.end(), c.words.begin(), c.words.end());
    help_argv.push_back("--help");
    const ProcessResult help = run_process(help_argv);
    ASSERT_EQ(help.exit_code, 0) << help.output;
    const auto options = options_with_values(help.output);
    EXPECT_GE(options.size(), 3u) << "no options read from the help of " << c.words.back() << ":\n"
                                  << help.output;
    for (const std::string& flag : options) {
      if (is_path_option(flag)) continue;
      std::vector<std::string> values = kValues;
      std::shuffle(values.begin(), values.end(), rng);
      values.resize(std::min(per_option, values.size()));
      for (const std::string& value : values) {
        std::vector<std::string> argv = {EXPAR_BINARY};
        argv.insert(argv.end(), c.words.begin(), c.words.end());
        std::vector<std::string> base = c.base;
        auto it = std::find(base.begin(), base.end(), flag);
        if (it != base.end() && it + 1 != base.end()) base.erase(it, it + 2);
        argv.insert(argv.end(), base.begin(), base.end());
        argv.insert(argv.end(), {flag, value});
        const ProcessResult r = run_process(argv, {{"OMP_NUM_THREADS", "1"}}, 20, "", scratch_.string());
        ++runs;
        std::string shown;
        for (const auto& a : argv) shown += " '" + a + "'";
        // A legal large value (--steps 100000) just runs long: stopped here, it is no failure.
        if (r.killed_at_limit) continue;
        EXPECT_EQ(r.signal, 0) << "ended by signal " << r.signal << ":" << shown << "\n" << r.output;
        const bool ok =
            r.exit_code == 0 || (r.exit_code == 1 && r.output.find("error:") != std::string::npos);
        EXPECT_TRUE(ok) << "status " << r.exit_code << ":" << shown << "\n" << r.output;
      }
    }
  }
  EXPECT_GT(runs, 100);
}

TEST_F(OptionsFuzz, UnknownCommandIsAnError) {
  for (const std::vector<std::string>& argv : std::vector<std::vector<std::string>>{
           {EXPAR_BINARY, "tokenise", "--help"}, {EXPAR_BINARY, "nosuch"}}) {
    const ProcessResult r = run_process(argv);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("error: unknown command '" + argv[1] + "'"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace expar
