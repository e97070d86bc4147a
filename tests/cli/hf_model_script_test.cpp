// scripts/make_tiny_hf_model.py, the random checkpoints users, tests and benchmarks run real shapes on: its
// presets write exactly the bytes and tensors of the published checkpoints; a gpt-oss checkpoint it writes in
// BF16 with MXFP4 experts, sharded, is a valid Hugging Face checkpoint (index and shards agree, the Hub's
// dtypes and shapes) that `expar eval` reads with the same loss on one rank and with TP 2 + EP; --dtype fp8
// writes the Hub's FP8 releases' block-scaled E4M3 storage, each block quantised by the script's rule;
// contradictory flags are refused with the fix. The DeepSeek-V3 (FP8, F32) and V2 (BF16) checkpoints it
// writes hold the Hub's names, shapes and dtypes and run alike on every layout; its DeepSeek presets' sizes
// are the published models' (cut to few layers and experts without writing gigabytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/temp_dir.hpp"
#include "expar/core/convert.hpp"
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
  // OLMoE's shapes in FP8: per layer 4 attention matrices 2048 x 2048 and 64 x 3 experts' 1024 x 2048 become
  // one byte a value (6710886400 bytes over 16 layers) plus F32 scales of their 16 x 16 and 8 x 16 blocks
  // (1638400 bytes); the rest stays BF16: 13838323712 - 2 * 6710886400. 3219 tensors plus 3136 scales.
  const ProcessResult fp8 =
      script({"--preset", "olmoe-1b-7b", "--dtype", "fp8", "--out", "/nonexistent/olmoe", "--dry-run"});
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find(
                "would write 6355 tensors, 7129075712 bytes (6.64 GiB) of fp8 weights (6710886400 bytes "
                "of F8_E4M3 codes + 1638400 of F32 block scales + 416550912 of BF16 other tensors)"),
            std::string::npos)
      << fp8.output;
  EXPECT_NE(fp8.output.find("\"quant_method\": \"fp8\""), std::string::npos) << fp8.output;
  EXPECT_FALSE(fs::exists("/nonexistent")) << "--dry-run wrote something";
}

TEST(HfModelScript, AShardedGptOssCheckpointIsReadLikeTheHubs) {
  test::TempDir dir("hf_model_script");
  const fs::path out = dir.path() / "gpt";
  // hidden and intermediate multiples of 32 (MXFP4 blocks); a vocabulary past uint16; shards of 3 MB.
  const ProcessResult made =
      script({"--family",       "gpt_oss",   "--dtype", "bf16",  "--hidden",          "64",
              "--intermediate", "32",        "--heads", "4",     "--kv-heads",        "2",
              "--head-dim",     "16",        "--vocab", "70000", "--max-shard-bytes", "3000000",
              "--out",          out.string()});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ShardedCheckpoint checkpoint = ShardedCheckpoint::open_directory(out);
  checkpoint.validate();  // every indexed tensor is in its shard and every shard's tensor is indexed
  EXPECT_EQ(checkpoint.shard_names().size(), 3u);
  int64_t bytes = 0;
  for (const std::string& name : checkpoint.names())
    bytes += static_cast<int64_t>(checkpoint.info(name).nbytes());
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
    std::vector<std::string> argv{
        EXPAR_BINARY, "eval", "--checkpoint", out.string(), "--data", (out / "tokens.bin").string(),
        "--tokens",   "100",  "--window",     "32"};
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

// The linear weights --dtype fp8 stores as E4M3 codes: attention's projections and the experts' matrices.
bool fp8_linear(const std::string& name) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (!ends_with(".weight")) return false;
  if (name.find(".self_attn.") != std::string::npos) return ends_with("_proj.weight");
  return name.find(".experts.") != std::string::npos || name.find(".shared_expert.") != std::string::npos;
}

// Half the spacing of E4M3 values around |x| (the most a nearest code may be off): 2^-10 among the
// subnormals (below 2^-6), else 2^(floor(log2 |x|) - 4).
double half_e4m3_step(double x) {
  const double a = std::fabs(x);
  return a < 0x1p-6 ? 0x1p-10 : std::ldexp(1.0, std::ilogb(a) - 4);
}

TEST(HfModelScript, Fp8CheckpointIsBlockScaledE4M3) {
  // The script's own check of its E4M3 encoder against a brute-force search of all 256 codes.
  const ProcessResult self_test = script({"--self-test"});
  ASSERT_EQ(self_test.exit_code, 0) << self_test.output;
  EXPECT_NE(self_test.output.find("self-test passed"), std::string::npos) << self_test.output;

  // Qwen3-MoE with hidden 160 and intermediate 96: experts' gate/up [96, 160] and down [160, 96], q [32, 160]
  // and o [160, 32], so blocks ragged in rows, in columns and in both. Shards of 100 kB: an index, with a
  // total_size.
  test::TempDir dir("hf_model_script_fp8");
  const fs::path out = dir.path() / "fp8", bf16_out = dir.path() / "bf16";
  const std::vector<std::string> sizes{"--family", "qwen3_moe", "--hidden", "160", "--intermediate", "96"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = sizes;
    args.insert(args.end(), {"--max-shard-bytes", "100000", "--seed", "7"});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const ProcessResult made = script(with({"--dtype", "fp8", "--out", out.string()}));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  // The same seed in BF16: the weights (all small, so drawn one by one in the same order) that fp8 quantised.
  const ProcessResult made_bf16 = script(with({"--dtype", "bf16", "--out", bf16_out.string()}));
  ASSERT_EQ(made_bf16.exit_code, 0) << made_bf16.output;

  std::ifstream config_file(out / "config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(config.at("quantization_config"),
            nlohmann::json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128]})"));

  ShardedCheckpoint checkpoint = ShardedCheckpoint::open_directory(out);
  checkpoint.validate();
  ShardedCheckpoint bf16 = ShardedCheckpoint::open_directory(bf16_out);
  int64_t bytes = 0, code_bytes = 0, scale_bytes = 0, bf16_bytes = 0;
  int converted = 0, blocks = 0;
  for (const std::string& name : checkpoint.names()) {
    const TensorInfo& info = checkpoint.info(name);
    bytes += static_cast<int64_t>(info.nbytes());
    if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) {
      EXPECT_TRUE(fp8_linear(name.substr(0, name.size() - 10))) << name;
      EXPECT_EQ(info.dtype, DType::F32) << name;
      scale_bytes += static_cast<int64_t>(info.nbytes());
      continue;
    }
    // Embeddings, lm_head, norms, the router's gate: BF16, as --dtype bf16 writes them.
    if (!fp8_linear(name)) {
      EXPECT_EQ(info.dtype, DType::BF16) << name;
      EXPECT_EQ(info.shape, bf16.info(name).shape) << name;
      bf16_bytes += static_cast<int64_t>(info.nbytes());
      continue;
    }
    ++converted;
    code_bytes += static_cast<int64_t>(info.nbytes());
    ASSERT_EQ(info.dtype, DType::F8E4M3) << name;
    ASSERT_EQ(info.shape.size(), 2u) << name;
    const int64_t rows = info.shape[0], cols = info.shape[1];
    const std::string scale_name = name + "_scale_inv";
    ASSERT_TRUE(checkpoint.contains(scale_name)) << name;
    const TensorInfo& scale_info = checkpoint.info(scale_name);
    ASSERT_EQ(scale_info.shape, (Shape{(rows + 127) / 128, (cols + 127) / 128})) << scale_name;
    ASSERT_EQ(scale_info.dtype, DType::F32) << scale_name;

    const Tensor codes = checkpoint.view(name);
    const Tensor scales = checkpoint.view(scale_name);
    const Tensor weight = bf16.view(name);
    ASSERT_EQ(weight.dtype(), DType::BF16) << name;
    const auto* code = static_cast<const uint8_t*>(codes.raw());
    const auto* w = static_cast<const uint16_t*>(weight.raw());
    for (int64_t br = 0; br < scale_info.shape[0]; ++br) {
      for (int64_t bc = 0; bc < scale_info.shape[1]; ++bc) {
        float scale = 0.0f;
        std::memcpy(&scale, static_cast<const char*>(scales.raw()) + 4 * (br * scale_info.shape[1] + bc), 4);
        // From the file alone: a positive finite multiplier, and the block's largest |w| coded as 448.
        EXPECT_TRUE(std::isfinite(scale) && scale > 0.0f) << name << " block " << br << "," << bc;
        float amax = 0.0f, amax_w = 0.0f;
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            const float value = e4m3_to_f32(code[r * cols + c]);
            ASSERT_FALSE(std::isnan(value)) << name << " [" << r << "," << c << "]";
            amax = std::max(amax, std::fabs(value));
            // Against the BF16 weight: the code is the E4M3 value nearest to w / scale (within half a step).
            const double x = static_cast<double>(bf16_to_f32(w[r * cols + c])) / scale;
            amax_w = std::max(amax_w, std::fabs(bf16_to_f32(w[r * cols + c])));
            ASSERT_LE(std::fabs(value - x), half_e4m3_step(x))
                << name << " [" << r << "," << c << "]: w / scale " << x << " coded as " << value;
          }
        }
        EXPECT_EQ(amax, 448.0f) << name << " block " << br << "," << bc;
        EXPECT_EQ(scale, amax_w / 448.0f) << name << " block " << br << "," << bc;  // amax / 448 in f32
        ++blocks;
      }
    }
  }
  // 2 layers of q, k, v, o and 8 experts' gate, up, down; blocks: q, k, v [32, 160] 1 x 2, o [160, 32] 2 x 1,
  // gate and up [96, 160] 1 x 2, down [160, 96] 2 x 1: (4 * 2 + 8 * 3 * 2) * 2.
  EXPECT_EQ(converted, 56);
  EXPECT_EQ(blocks, 112);

  // --dry-run's totals are what was written: the index's total_size, and each dtype's share.
  EXPECT_EQ(checkpoint.metadata().at("total_size").get<int64_t>(), bytes);
  const ProcessResult dry =
      script(with({"--dtype", "fp8", "--out", (dir.path() / "dry").string(), "--dry-run"}));
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_FALSE(fs::exists(dir.path() / "dry"));
  // (Built with +=: GCC 12 warns falsely on "literal" + std::string&&.)
  std::string totals = "would write ";
  totals += std::to_string(checkpoint.names().size()) + " tensors, ";
  totals += std::to_string(bytes) + " bytes";
  EXPECT_NE(dry.output.find(totals), std::string::npos) << totals << "\n" << dry.output;
  std::string shares = "(";
  shares += std::to_string(code_bytes) + " bytes of F8_E4M3 codes + ";
  shares += std::to_string(scale_bytes) + " of F32 block scales + ";
  shares += std::to_string(bf16_bytes) + " of BF16 other tensors) in ";
  shares += std::to_string(checkpoint.shard_names().size()) + " file(s)";
  EXPECT_NE(dry.output.find(shares), std::string::npos) << shares << "\n" << dry.output;
}

TEST(HfModelScript, ContradictionsAreRefusedWithTheFix) {
  const ProcessResult preset =
      script({"--preset", "gpt-oss-20b", "--hidden", "1024", "--out", "/x", "--dry-run"});
  EXPECT_NE(preset.exit_code, 0);
  EXPECT_NE(preset.output.find("--hidden 1024 contradicts --preset gpt-oss-20b (2880): leave it out"),
            std::string::npos)
      << preset.output;
  const ProcessResult blocks = script({"--family", "gpt_oss", "--hidden", "40", "--out", "/x", "--dry-run"});
  EXPECT_NE(blocks.exit_code, 0);
  EXPECT_NE(blocks.output.find("choose --hidden and --intermediate multiples of 32"), std::string::npos)
      << blocks.output;
  // gpt-oss ships MXFP4 experts, not FP8: refused, by family and by preset, naming --dtype bf16.
  for (const std::vector<std::string>& which : {std::vector<std::string>{"--family", "gpt_oss"},
                                                std::vector<std::string>{"--preset", "gpt-oss-20b"}}) {
    std::vector<std::string> args = which;
    args.insert(args.end(), {"--dtype", "fp8", "--out", "/nonexistent/fp8", "--dry-run"});
    const ProcessResult fp8 = script(args);
    EXPECT_NE(fp8.exit_code, 0);
    EXPECT_NE(fp8.output.find("its experts are MXFP4"), std::string::npos) << fp8.output;
    EXPECT_NE(fp8.output.find("use --dtype bf16"), std::string::npos) << fp8.output;
  }
  // A preset may be cut to fewer experts only where DeepSeek-V3's router stays valid (8 groups, top-8 of the
  // best 4): 12 is no multiple of 8, 8 leaves 4 experts in the best groups.
  for (const char* experts : {"12", "8"}) {
    const ProcessResult cut =
        script({"--preset", "deepseek-v3", "--experts", experts, "--out", "/nonexistent/v3", "--dry-run"});
    EXPECT_NE(cut.exit_code, 0);
    EXPECT_NE(cut.output.find("e.g. --experts 16"), std::string::npos) << cut.output;
  }
  // Latent attention has a key and value per head; DeepSeek's flags are refused for other families.
  const ProcessResult kv = script({"--family", "deepseek_v3", "--kv-heads", "2", "--out", "/x", "--dry-run"});
  EXPECT_NE(kv.exit_code, 0);
  EXPECT_NE(kv.output.find("--kv-heads 2: latent attention has a key and value per query head"),
            std::string::npos)
      << kv.output;
  const ProcessResult head =
      script({"--family", "deepseek_v2", "--head-dim", "8", "--out", "/x", "--dry-run"});
  EXPECT_NE(head.exit_code, 0);
  EXPECT_NE(head.output.find("use --qk-nope-head-dim, --qk-rope-head-dim and --v-head-dim"),
            std::string::npos)
      << head.output;
  const ProcessResult other =
      script({"--family", "qwen3_moe", "--kv-lora-rank", "8", "--out", "/x", "--dry-run"});
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.output.find("--kv-lora-rank is DeepSeek's"), std::string::npos) << other.output;
  EXPECT_FALSE(fs::exists("/nonexistent"));
}

TEST(HfModelScript, AnFp8CheckpointEvaluatesAlikeOnEveryLayout) {
  // The engine holds the script's FP8 weights as stored (model/fp8_store.hpp): one rank, TP 2 (gate/up shards
  // of 64 rows widened with their down shards) and TP 2 with EP (whole experts in FP8) give the same loss.
  test::TempDir dir("hf_model_script_fp8");
  const fs::path out = dir.path() / "qwen3";
  const ProcessResult made = script({"--family", "qwen3_moe", "--dtype", "fp8", "--hidden", "256",
                                     "--intermediate", "128", "--out", out.string()});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto loss_line = [&](const std::vector<std::string>& layout) {
    std::vector<std::string> argv{
        EXPAR_BINARY, "eval", "--checkpoint", out.string(), "--data", (out / "tokens.bin").string(),
        "--tokens",   "100",  "--window",     "32"};
    argv.insert(argv.end(), layout.begin(), layout.end());
    const ProcessResult r = run_process(argv, {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(" fp8 "), std::string::npos) << r.output;  // the startup line's formats
    const size_t at = r.output.find("loss ");
    EXPECT_NE(at, std::string::npos) << r.output;
    return at == std::string::npos ? 0.0 : std::stod(r.output.substr(at + 5));
  };
  // TP sums partial products in another order: the same loss within 1e-5 relative.
  const double one = loss_line({});
  EXPECT_GT(one, 0.0);
  EXPECT_NEAR(loss_line({"--tp", "2"}), one, 1e-5 * one);
  EXPECT_NEAR(loss_line({"--tp", "2", "--enable-expert-parallel"}), one, 1e-5 * one);
}

// DeepSeek's linear weights, the ones the Hub's DeepSeek-V3 stores in FP8: the latent attention's projections
// (q_a/q_b or q, kv_a_proj_with_mqa, kv_b, o), the dense layers' MLP and the routed and shared experts'
// matrices; not the norms, the embeddings, lm_head, the router (mlp.gate.weight) or its correction bias.
bool deepseek_linear(const std::string& name) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("_proj.weight") || ends_with("_proj_with_mqa.weight");
}

// `expar eval` on the script's tokens: the loss it prints (0 when none), the output into `output`.
double eval_loss(const fs::path& out, const std::vector<std::string>& layout, std::string* output = nullptr) {
  std::vector<std::string> argv{
      EXPAR_BINARY, "eval", "--checkpoint", out.string(), "--data", (out / "tokens.bin").string(),
      "--tokens",   "100",  "--window",     "32"};
  argv.insert(argv.end(), layout.begin(), layout.end());
  const ProcessResult r = run_process(argv, {}, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (output) *output = r.output;
  const size_t at = r.output.find("loss ");
  EXPECT_NE(at, std::string::npos) << r.output;
  return at == std::string::npos ? 0.0 : std::stod(r.output.substr(at + 5));
}

TEST(HfModelScript, DeepseekCheckpointsRunAlikeOnEveryLayout) {
  // The tiny defaults: hidden 64, 3 layers (layer 0 dense, intermediate 96), 4 heads, kv_lora 32, nope 16,
  // rope 8, v 16; V3 q_lora 32, 8 experts of 32 in 4 groups (best 2), top-2, 1 shared expert; V2 a plain
  // q_proj, softmax greedy top-2, 2 shared experts.
  struct Case {
    std::string family, dtype;
  };
  test::TempDir dir("hf_model_script_deepseek");
  for (const Case& c :
       {Case{"deepseek_v3", "fp8"}, Case{"deepseek_v3", "f32"}, Case{"deepseek_v2", "bf16"}}) {
    SCOPED_TRACE(c.family + " " + c.dtype);
    const bool v3 = c.family == "deepseek_v3", fp8 = c.dtype == "fp8";
    const fs::path out = dir.path() / (c.family + "-" + c.dtype);
    const ProcessResult made = script({"--family", c.family, "--dtype", c.dtype, "--out", out.string()});
    ASSERT_EQ(made.exit_code, 0) << made.output;

    std::ifstream config_file(out / "config.json");
    const nlohmann::json config = nlohmann::json::parse(config_file);
    EXPECT_EQ(config.at("model_type"), c.family);
    EXPECT_EQ(config.at("num_key_value_heads"), config.at("num_attention_heads"));
    EXPECT_EQ(config.at("q_lora_rank"), v3 ? nlohmann::json(32) : nlohmann::json(nullptr));
    EXPECT_EQ(config.at("topk_method"), v3 ? "noaux_tc" : "greedy");
    EXPECT_EQ(config.at("rope_scaling").at("type"), "yarn");
    EXPECT_EQ(config.contains("quantization_config"), fp8);

    // The tensors: every name and dtype as the Hub stores them, and the shapes of one dense and one MoE
    // layer.
    ShardedCheckpoint checkpoint = ShardedCheckpoint::open_directory(out);
    checkpoint.validate();
    const DType plain = c.dtype == "f32" ? DType::F32 : DType::BF16;
    int codes = 0, biases = 0;
    for (const std::string& name : checkpoint.names()) {
      const DType dtype = checkpoint.info(name).dtype;
      if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) {
        EXPECT_TRUE(fp8 && deepseek_linear(name.substr(0, name.size() - 10))) << name;
        EXPECT_EQ(dtype, DType::F32) << name;
      } else if (name.find("e_score_correction_bias") != std::string::npos) {
        EXPECT_EQ(dtype, DType::F32) << name;  // F32 in every dtype, as the Hub's DeepSeek-V3
        ++biases;
      } else if (fp8 && deepseek_linear(name)) {
        EXPECT_EQ(dtype, DType::F8E4M3) << name;
        EXPECT_TRUE(checkpoint.contains(name + "_scale_inv")) << name;
        ++codes;
      } else {
        EXPECT_EQ(dtype, plain) << name;
      }
    }
    EXPECT_EQ(biases, v3 ? 2 : 0);  // the two MoE layers
    // Per layer 5 attention projections (V2: 4); layer 0's dense MLP 3; layers 1 and 2: 8 experts and the
    // shared experts, 3 each.
    EXPECT_EQ(codes, fp8 ? 3 * 5 + 3 + 2 * 27 : 0);
    auto shape = [&](const std::string& name) {
      return checkpoint.contains(name) ? checkpoint.info(name).shape : Shape{};
    };
    const std::string a = "model.layers.1.self_attn.", m = "model.layers.1.mlp.";
    if (v3) {
      EXPECT_EQ(shape(a + "q_a_proj.weight"), (Shape{32, 64}));
      EXPECT_EQ(shape(a + "q_a_layernorm.weight"), (Shape{32}));
      EXPECT_EQ(shape(a + "q_b_proj.weight"), (Shape{4 * 24, 32}));
      EXPECT_FALSE(checkpoint.contains(a + "q_proj.weight"));
      EXPECT_EQ(shape(m + "gate.e_score_correction_bias"), (Shape{8}));
    } else {
      EXPECT_EQ(shape(a + "q_proj.weight"), (Shape{4 * 24, 64}));
      EXPECT_FALSE(checkpoint.contains(a + "q_a_proj.weight"));
      EXPECT_FALSE(checkpoint.contains(m + "gate.e_score_correction_bias"));
    }
    EXPECT_EQ(shape(a + "kv_a_proj_with_mqa.weight"), (Shape{32 + 8, 64}));
    EXPECT_EQ(shape(a + "kv_a_layernorm.weight"), (Shape{32}));
    EXPECT_EQ(shape(a + "kv_b_proj.weight"), (Shape{4 * (16 + 16), 32}));
    EXPECT_EQ(shape(a + "o_proj.weight"), (Shape{64, 4 * 16}));
    EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (Shape{96, 64}));
    EXPECT_EQ(shape("model.layers.0.mlp.down_proj.weight"), (Shape{64, 96}));
    EXPECT_FALSE(checkpoint.contains("model.layers.0.mlp.gate.weight"));
    EXPECT_EQ(shape(m + "gate.weight"), (Shape{8, 64}));
    EXPECT_EQ(shape(m + "experts.7.up_proj.weight"), (Shape{32, 64}));
    EXPECT_EQ(shape(m + "experts.7.down_proj.weight"), (Shape{64, 32}));
    EXPECT_EQ(shape(m + "shared_experts.gate_proj.weight"), (Shape{(v3 ? 1 : 2) * 32, 64}));

    // expar reads it (config and tensors) and gives one loss on one rank, TP 2 and TP 2 with EP (TP sums
    // partial products in another order: within 1e-5 relative).
    std::string output;
    const double one = eval_loss(out, {}, &output);
    EXPECT_GT(one, 0.0);
    EXPECT_EQ(output.find(" fp8 ") != std::string::npos, fp8) << output;  // the startup line's formats
    EXPECT_NEAR(eval_loss(out, {"--tp", "2"}), one, 1e-5 * one);
    EXPECT_NEAR(eval_loss(out, {"--tp", "2", "--enable-expert-parallel"}), one, 1e-5 * one);

    // `expar generate` decodes it (through the latent cache), greedily to the same tokens on both layouts.
    auto generated = [&](const std::vector<std::string>& layout) {
      std::vector<std::string> argv{
          EXPAR_BINARY, "generate", "--checkpoint", out.string(), "--prompt-ids", "1",
          "2",          "3",        "--tokens",     "6"};
      argv.insert(argv.end(), layout.begin(), layout.end());
      const ProcessResult r = run_process(argv, {}, 300);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      // The tokens' line (stdout, among stderr's report): the last of digits and spaces only.
      std::string tokens, line;
      std::istringstream lines(r.output);
      while (std::getline(lines, line))
        if (!line.empty() && line.find_first_not_of("0123456789 ") == std::string::npos) tokens = line;
      return tokens;
    };
    const std::string tokens = generated({});
    EXPECT_EQ(std::count(tokens.begin(), tokens.end(), ' '), 5) << tokens;
    EXPECT_EQ(generated({"--tp", "2", "--enable-expert-parallel"}), tokens);
  }
}

TEST(HfModelScript, DeepseekPresetsWriteTheirShapesAndCutToFewExperts) {
  // DeepSeek-V3 cut to 4 layers (3 dense, as its first_k_dense_replace) and 32 routed experts (8 groups of 4;
  // the best 4 groups hold 16 >= top-8), its widths real. FP8 codes: per layer attention q_a 1536 x 7168,
  // q_b 24576 x 1536, kv_a_proj_with_mqa 576 x 7168, kv_b 32768 x 512, o 7168 x 16384 (187105280); 3 dense
  // MLPs of 3 x 18432 x 7168; the MoE layer's 32 + 1 shared experts of 3 x 2048 x 7168: 3390832640. Block
  // scales: (672 + 2304 + 280 + 1024 + 7168) x 4 + 24192 x 3 + 2688 x 33 blocks of 4 bytes. BF16: embeddings
  // and lm_head 2 x 129280 x 7168, the norms (9 x 7168 + 4 x 2048) and the router 32 x 7168. F32: the
  // correction bias [32]. Tensors: 3 + 3 x 12 + 110, and 128 scale grids.
  test::TempDir dir("hf_model_script_deepseek_preset");
  const ProcessResult cut = script({"--preset", "deepseek-v3", "--layers", "4", "--experts", "32", "--out",
                                    (dir.path() / "v3").string(), "--dry-run"});
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  EXPECT_NE(cut.output.find("would write 277 tensors, 7098981376 bytes (6.61 GiB) of fp8 weights (3390832640 "
                            "bytes of F8_E4M3 codes + 828288 of F32 block scales + 3707320320 of BF16 other "
                            "tensors + 128 of F32 router correction biases) in 2 file(s)"),
            std::string::npos)
      << cut.output;
  // The config it would write is what expar reads: the preset's keys with the cut.
  const size_t end = cut.output.find("\nwould write");
  ASSERT_NE(end, std::string::npos) << cut.output;
  const nlohmann::json config = nlohmann::json::parse(cut.output.substr(0, end));
  EXPECT_EQ(config.at("model_type"), "deepseek_v3");
  EXPECT_EQ(config.at("num_hidden_layers"), 4);
  EXPECT_EQ(config.at("n_routed_experts"), 32);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, int>>{{"hidden_size", 7168},
                                                {"num_attention_heads", 128},
                                                {"num_key_value_heads", 128},
                                                {"q_lora_rank", 1536},
                                                {"kv_lora_rank", 512},
                                                {"qk_nope_head_dim", 128},
                                                {"qk_rope_head_dim", 64},
                                                {"v_head_dim", 128},
                                                {"num_experts_per_tok", 8},
                                                {"n_group", 8},
                                                {"topk_group", 4},
                                                {"moe_intermediate_size", 2048},
                                                {"intermediate_size", 18432},
                                                {"first_k_dense_replace", 3},
                                                {"vocab_size", 129280},
                                                {"max_position_embeddings", 163840}})
    EXPECT_EQ(config.at(key), value) << key;
  EXPECT_EQ(config.at("rope_scaling"), nlohmann::json::parse(R"({"type": "yarn", "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1})"));
  EXPECT_EQ(config.at("quantization_config").at("quant_method"), "fp8");
  EXPECT_FALSE(fs::exists(dir.path() / "v3")) << "--dry-run wrote something";

  // Whole: DeepSeek-V3's 671B parameters are these FP8 codes (61 layers' attention, 3 dense MLPs, 58 layers
  // of 256 + 1 experts) and the BF16 embeddings, lm_head, norms and routers (its MTP layer is not written).
  const ProcessResult whole = script({"--preset", "deepseek-v3", "--out", "/nonexistent/v3", "--dry-run"});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_NE(whole.output.find("(669065609216 bytes of F8_E4M3 codes"), std::string::npos) << whole.output;
  // DeepSeek-V2-Lite's 15.7B parameters in BF16: 15706484224 x 2 bytes.
  const ProcessResult lite =
      script({"--preset", "deepseek-v2-lite", "--out", "/nonexistent/lite", "--dry-run"});
  ASSERT_EQ(lite.exit_code, 0) << lite.output;
  EXPECT_NE(lite.output.find(", 31412968448 bytes (29.26 GiB) of bf16 weights in"), std::string::npos)
      << lite.output;
  EXPECT_NE(lite.output.find("\"q_lora_rank\": null"), std::string::npos) << lite.output;
  EXPECT_FALSE(fs::exists("/nonexistent"));
}

}  // namespace
}  // namespace expar
