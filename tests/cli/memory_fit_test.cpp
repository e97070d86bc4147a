// Knowing before loading whether a model fits: `expar plan --model DIR --kv-tokens N` prints what each rank
// of an inference layout holds by format, and generate, eval and serve refuse a model that does not fit in
// --memory-limit-gib (default: the machine's available memory) before loading, naming the bytes and a fix
// that the command then accepts; while loading they show what has been read. Run through the binary on a
// gpt-oss checkpoint with MXFP4 experts, whose experts TP 2 without expert parallelism widens to f32 (shards
// of 16 rows cut the 32-value blocks).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
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

class MemoryFit : public ::testing::Test {
 protected:
  void SetUp() override {
    const ProcessResult made =
        run_process({"python3",        EXPAR_SOURCE_DIR "/scripts/make_tiny_hf_model.py",
                     "--family",       "gpt_oss",
                     "--dtype",        "bf16",
                     "--hidden",       "64",
                     "--intermediate", "32",
                     "--heads",        "4",
                     "--kv-heads",     "2",
                     "--head-dim",     "16",
                     "--vocab",        "512",
                     "--out",          model_.string()},
                    {}, 300);
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }

  nlohmann::json plan(const std::vector<std::string>& layout) const {
    std::vector<std::string> argv{EXPAR_BINARY, "plan", "--model", model_.string(), "--kv-tokens", "16"};
    argv.insert(argv.end(), layout.begin(), layout.end());
    argv.insert(argv.end(), {"--json", "-"});
    const ProcessResult r = run_process(argv, {}, 120);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  }

  ProcessResult generate(const std::vector<std::string>& flags) const {
    std::vector<std::string> argv{EXPAR_BINARY,    "generate",     "--checkpoint",
                                  model_.string(), "--prompt-ids", "1,2,3"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (std::find(flags.begin(), flags.end(), "--tokens") == flags.end())
      argv.insert(argv.end(), {"--tokens", "13"});
    return run_process(argv, {}, 300);
  }

  test::TempDir dir_{"memory_fit"};
  fs::path model_ = dir_.path() / "gpt";
};

std::string gib(int64_t bytes) {
  return fmt::format("{:.12f}", static_cast<double>(bytes) / 0x1p30);
}

TEST_F(MemoryFit, ThePlanShowsEachRanksFormatsAndTheRefusalNamesAFixThatRuns) {
  const nlohmann::json sharded = plan({"--tp", "2"});
  const nlohmann::json ep = plan({"--tp", "2", "--enable-expert-parallel"});
  ASSERT_EQ(ep.at("ranks").size(), 2u) << ep.dump();
  for (const auto& rank : ep.at("ranks")) {
    EXPECT_GT(rank.at("held_bytes").at("mxfp4").get<int64_t>(), 0) << ep.dump();
    EXPECT_GT(rank.at("held_bytes").at("bf16").get<int64_t>(), 0) << ep.dump();
    EXPECT_EQ(rank.at("local_experts"), 4) << ep.dump();
  }
  for (const auto& rank : sharded.at("ranks"))
    EXPECT_EQ(rank.at("held_bytes").at("mxfp4"), 0) << sharded.dump();
  // Two redundant experts: 10 slots, 5 per rank, each replica's weights counted like its expert's.
  const nlohmann::json replicas = plan({"--tp", "2", "--enable-expert-parallel", "--redundant-experts", "2"});
  for (size_t r = 0; r < 2; ++r) {
    const auto& with = replicas.at("ranks").at(r);
    const auto& without = ep.at("ranks").at(r);
    EXPECT_EQ(with.at("local_experts"), 5) << replicas.dump();
    EXPECT_EQ(with.at("expert_bytes").get<int64_t>() * 4, without.at("expert_bytes").get<int64_t>() * 5)
        << replicas.dump();
    EXPECT_EQ(with.at("dense_bytes"), without.at("dense_bytes")) << replicas.dump();
  }
  const int64_t need_sharded = sharded.at("process_bytes"), need_ep = ep.at("process_bytes");
  ASSERT_LT(need_ep, need_sharded);

  // The memory the EP layout needs: TP 2 without EP is refused before loading, with the EP layout as fix.
  const std::string limit = gib(need_ep);
  const ProcessResult refused = generate({"--tp", "2", "--memory-limit-gib", limit});
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("does not fit"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("run with --tp 2 --dp 1 --enable-expert-parallel"), std::string::npos)
      << refused.output;
  EXPECT_EQ(refused.output.find("rank 0 memory"), std::string::npos) << "it loaded: " << refused.output;
  const ProcessResult fixed =
      generate({"--tp", "2", "--dp", "1", "--enable-expert-parallel", "--memory-limit-gib", limit});
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
  // The startup line names each rank's formats.
  EXPECT_NE(fixed.output.find("rank 0: bf16 56.00 KiB + mxfp4 25.50 KiB"), std::string::npos) << fixed.output;
  // And when the load is complete, what it read (every rank's weights: the plan's bytes, mapped included).
  int64_t planned = 0;
  for (const auto& rank : ep.at("ranks"))
    planned += rank.at("dense_bytes").get<int64_t>() + rank.at("expert_bytes").get<int64_t>() +
               rank.at("mapped_bytes").get<int64_t>();
  EXPECT_NE(fixed.output.find(fmt::format("expar generate: loaded {:.2f} KiB in ", planned / 1024.0)),
            std::string::npos)
      << planned << " bytes planned: " << fixed.output;

  // Too many positions for the KV cache: the --tokens that fits, accepted.
  const ProcessResult long_run =
      generate({"--tp", "2", "--enable-expert-parallel", "--memory-limit-gib", gib(need_ep - 1)});
  EXPECT_NE(long_run.exit_code, 0) << long_run.output;
  const size_t at = long_run.output.find("pass --tokens ");
  ASSERT_NE(at, std::string::npos) << long_run.output;
  const std::string tokens =
      long_run.output.substr(at + 14, long_run.output.find_first_not_of("0123456789", at + 14) - at - 14);
  EXPECT_LT(std::stoi(tokens), 13);
  const ProcessResult shorter = generate(
      {"--tp", "2", "--enable-expert-parallel", "--memory-limit-gib", gib(need_ep - 1), "--tokens", tokens});
  EXPECT_EQ(shorter.exit_code, 0) << shorter.output;

  // serve and eval refuse by the same rule.
  const ProcessResult serve = run_process({EXPAR_BINARY, "serve", "--checkpoint", model_.string(), "--tp",
                                           "2", "--port", "0", "--memory-limit-gib", limit},
                                          {}, 120);
  EXPECT_NE(serve.exit_code, 0) << serve.output;
  EXPECT_NE(serve.output.find("does not fit"), std::string::npos) << serve.output;
  const ProcessResult eval =
      run_process({EXPAR_BINARY, "eval", "--checkpoint", model_.string(), "--data",
                   (model_ / "tokens.bin").string(), "--tp", "2", "--memory-limit-gib", limit},
                  {}, 120);
  EXPECT_NE(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("does not fit"), std::string::npos) << eval.output;
}

TEST_F(MemoryFit, TrainingFlagsInAnInferencePlanAreRefused) {
  const ProcessResult r = run_process(
      {EXPAR_BINARY, "plan", "--model", model_.string(), "--kv-tokens", "16", "--ranks", "4"}, {}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--ranks belongs to the training plan"), std::string::npos) << r.output;
  const ProcessResult dp =
      run_process({EXPAR_BINARY, "plan", "--model", model_.string(), "--dp", "2"}, {}, 60);
  EXPECT_NE(dp.exit_code, 0);
  EXPECT_NE(dp.output.find("add --kv-tokens N"), std::string::npos) << dp.output;
}

}  // namespace
}  // namespace expar
