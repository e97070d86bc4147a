// scripts/make_tiny_hf_model.py, the random checkpoints users, tests and benchmarks run real shapes on: its
// presets write exactly the bytes and tensors of the published checkpoints; a gpt-oss checkpoint it writes in
// BF16 with MXFP4 experts, sharded, is a valid Hugging Face checkpoint (index and shards agree, the Hub's
// dtypes and shapes) that `expar eval` reads with the same loss on one rank and with TP 2 + EP; contradictory
// flags are refused with the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_process;

const std::string kScript = EXPAR_SOURCE_DIR "/scripts/make_tiny_hf_model.py";

ProcessResult script(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"python3", kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 300);
}

TEST(HfModelScript, PresetsWriteThePublishedSizes) {
  // gpt-oss-20b's model.safetensors.index.json says total_size 13761264768 over 459 tensors; OLMoE-1B-7B's
  // BF16 parameters are 13838323712 bytes (docs/references.md, "Published checkpoint sizes").
  const ProcessResult gpt = script({"--preset", "gpt-oss-20b", "--out", "/nonexistent/gpt", "--dry-run"});
  ASSERT_EQ(gpt.exit_code, 0) << gpt.output;
  EXPECT_NE(gpt.output.find("would write 459 tensors, 13761264768 bytes"), std::string::npos) << gpt.output;
  EXPECT_NE(gpt.output.find("\"quant_method\": \"mxfp4\""), std::string::npos) << gpt.output;
  const ProcessResult olmoe = script({"--preset", "olmoe-1b-7b", "--out", "/nonexistent/olmoe", "--dry-run"});
  ASSERT_EQ(olmoe.exit_code, 0) << olmoe.output;
  EXPECT_NE(olmoe.output.find(", 13838323712 bytes"), std::string::npos) << olmoe.output;
  EXPECT_FALSE(fs::exists("/nonexistent")) << "--dry-run wrote something";
}

TEST(HfModelScript, AShardedGptOssCheckpointIsReadLikeTheHubs) {
  test::TempDir dir("hf_model_script");
  const fs::path out = dir.path() / "gpt";
  // hidden and intermediate multiples of 32 (MXFP4 blocks); a vocabulary past uint16; shards of 3 MB.
  const ProcessResult made = script({"--family", "gpt_oss", "--dtype", "bf16", "--hidden", "64", "--intermediate",
                                     "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--vocab",
                                     "70000", "--max-shard-bytes", "3000000", "--out", out.string()});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ShardedCheckpoint checkpoint = ShardedCheckpoint::open_directory(out);
  checkpoint.validate();  // every indexed tensor is in its shard and every shard's tensor is indexed
  EXPECT_EQ(checkpoint.shard_names().size(), 3u);
  int64_t bytes = 0;
  for (const std::string& name : checkpoint.names()) bytes += static_cast<int64_t>(checkpoint.info(name).nbytes());
  EXPECT_EQ(checkpoint.metadata().at("total_size").get<int64_t>(), bytes);
  // The Hub's storage: BF16 dense weights, the experts as U8 blocks [E, out, in/32, 16] and scales.
  const std::string experts = "model.layers.1.mlp.experts.";
  EXPECT_EQ(checkpoint.info("model.layers.0.self_attn.q_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(checkpoint.info(experts + "gate_up_proj_blocks").dtype, DType::U8);
  EXPECT_EQ(checkpoint.info(experts + "gate_up_proj_blocks").shape, (Shape{8, 64, 2, 16}));
  EXPECT_EQ(checkpoint.info(experts + "gate_up_proj_scales").shape, (Shape{8, 64, 2}));
  EXPECT_EQ(checkpoint.info(experts + "down_proj_blocks").shape, (Shape{8, 64, 1, 16}));
  EXPECT_EQ(checkpoint.info(experts + "gate_up_proj_bias").dtype, DType::BF16);
  std::ifstream sidecar(out / "tokens.bin.json");
  EXPECT_EQ(nlohmann::json::parse(sidecar).at("dtype"), "uint32");

  // One rank and TP 2 with expert parallelism read it to the same loss.
  auto loss_line = [&](const std::vector<std::string>& layout) {
    std::vector<std::string> argv{EXPAR_BINARY, "eval", "--checkpoint", out.string(), "--data",
                                  (out / "tokens.bin").string(), "--tokens", "100", "--window", "32"};
    argv.insert(argv.end(), layout.begin(), layout.end());
    const ProcessResult r = run_process(argv, {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find("loss ");
    return at == std::string::npos ? r.output : r.output.substr(at, r.output.find(" nats", at) - at);
  };
  const std::string one = loss_line({});
  EXPECT_EQ(one.rfind("loss ", 0), 0u) << one;
  EXPECT_EQ(loss_line({"--tp", "2", "--enable-expert-parallel"}), one);
}

TEST(HfModelScript, ContradictionsAreRefusedWithTheFix) {
  const ProcessResult preset = script({"--preset", "gpt-oss-20b", "--hidden", "1024", "--out", "/x", "--dry-run"});
  EXPECT_NE(preset.exit_code, 0);
  EXPECT_NE(preset.output.find("--hidden 1024 contradicts --preset gpt-oss-20b (2880): leave it out"),
            std::string::npos)
      << preset.output;
  const ProcessResult blocks = script({"--family", "gpt_oss", "--hidden", "40", "--out", "/x", "--dry-run"});
  EXPECT_NE(blocks.exit_code, 0);
  EXPECT_NE(blocks.output.find("choose --hidden and --intermediate multiples of 32"), std::string::npos)
      << blocks.output;
}

}  // namespace
}  // namespace expar
