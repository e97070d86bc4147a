// `--precision f32|bf16`, the products' precision, run as a user would.
// expar train: refused by name, with the reason, where oneDNN has no BF16 dot products (checked on any
// machine by capping oneDNN's ISA with DNNL_MAX_CPU_ISA: AVX2, the AMD kind this project also runs on, and
// AVX512_CORE, AVX-512 without BF16); where the CPU has them, the payload flags default to bf16 with BF16
// products unless one is given, on the paths that move reduced-precision rows.
// expar plan: --precision bf16 is --param-dtype bf16 with the f32 masters and BF16 payloads (half the lease
// pool's slot bytes of --precision f32 when the rows are the same), --precision f32 is --param-dtype f32;
// --precision with --param-dtype is refused by name.
// The inference commands (generate, eval, serve, bench generate): --precision f32|bf16 with train's meaning;
// another value is refused naming the accepted ones, bf16 refused where oneDNN has no BF16 dot products,
// naming the fix (--precision f32), which then runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expar/core/matmul.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

using testing::ProcessResult;
using testing::run_process;

std::vector<std::string> tiny_train(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      EXPAR_BINARY, "train",     "--preset",     "tiny", "--steps", "1",
      "--batch",    "4",         "--seq-len",    "8",    "--data",  EXPAR_SOURCE_DIR "/data/kjv.txt",
      "--log",      "/dev/null", "--eval-every", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

TEST(TrainPrecision, Bf16IsRefusedByNameWithoutBf16DotProducts) {
  for (const char* isa : {"AVX2", "AVX512_CORE"}) {
    const ProcessResult r = run_process(tiny_train({"--ranks", "2", "--ep", "2", "--precision", "bf16"}),
                                        {{"DNNL_MAX_CPU_ISA", isa}}, 120);
    EXPECT_EQ(r.exit_code, 1) << isa << "\n" << r.output;
    for (const char* part : {"error: ", "expar train --precision bf16 needs a CPU with BF16 dot products",
                             "capped by DNNL_MAX_CPU_ISA"})
      EXPECT_NE(r.output.find(part), std::string::npos) << isa << ": " << part << "\n" << r.output;
  }
}

TEST(TrainPrecision, Bf16ProductsDefaultThePayloadsToBf16UnlessALegSaysOtherwise) {
  if (!bf16_native())
    GTEST_SKIP() << "--precision bf16 needs BF16 dot products; oneDNN runs " << dnnl_isa_name();
  struct Case {
    std::vector<std::string> flags;
    std::string banner;
  };
  const std::vector<Case> cases = {
      {{"--ranks", "2", "--ep", "2", "--precision", "bf16"},
       "payload dispatch bf16, combine bf16, combine-grad bf16, dispatch-grad bf16"},
      {{"--ranks", "2", "--ep", "2", "--precision", "bf16", "--combine-precision", "f32",
        "--dispatch-precision", "mxfp8"},
       "payload dispatch mxfp8, combine f32, combine-grad bf16, dispatch-grad bf16"},
      {{"--ranks", "2", "--ep", "2"}, "payload f32\n"},
      {{"--ranks", "1", "--ep", "1", "--path", "local", "--precision", "bf16"}, "payload f32\n"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_process(tiny_train(c.flags), {}, 300);
    std::string shown;
    for (const auto& f : c.flags) shown += " " + f;
    EXPECT_EQ(r.exit_code, 0) << shown << "\n" << r.output;
    EXPECT_NE(r.output.find(c.banner), std::string::npos) << shown << "\n" << r.output;
    const bool bf16 = shown.find("--precision bf16") != std::string::npos;
    EXPECT_NE(r.output.find(bf16 ? "products bf16 (f32 master weights)" : "products f32"), std::string::npos)
        << shown << "\n"
        << r.output;
  }
}

nlohmann::json plan_json(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {EXPAR_BINARY, "plan", "--preset", "mixtral-8x7b", "--ranks", "8",
                                   "--ep",       "8",    "--tokens", "512",          "--json",  "-"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const ProcessResult r = run_process(argv, {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output.substr(r.output.find('{')));
}

TEST(PlanPrecision, PrecisionSetsTheParametersAndThePayloadsAsTrainHoldsThem) {
  const nlohmann::json bf16 = plan_json({"--precision", "bf16"});
  const nlohmann::json as_dtypes =
      plan_json({"--param-dtype", "bf16", "--dispatch-precision", "bf16", "--combine-precision", "bf16",
                 "--combine-grad-precision", "bf16", "--dispatch-grad-precision", "bf16"});
  EXPECT_EQ(bf16["stages"], as_dtypes["stages"]);
  const nlohmann::json f32 = plan_json({"--precision", "f32"});
  EXPECT_EQ(f32["stages"], plan_json({"--param-dtype", "f32", "--activation-dtype", "f32"})["stages"]);
  const auto& s16 = bf16["stages"][0]["bytes_per_rank"];
  const auto& s32 = f32["stages"][0]["bytes_per_rank"];
  // The weights are held twice: BF16 (the weights line) and f32 (the master, with the optimizer state).
  EXPECT_EQ(2 * s16["dense_weights"].get<int64_t>(), s32["dense_weights"].get<int64_t>());
  EXPECT_EQ(s16["expert_optimizer_state"].get<int64_t>(),
            s32["expert_optimizer_state"].get<int64_t>() + s32["expert_weights"].get<int64_t>());
  EXPECT_EQ(2 * bf16["tokens"]["slot_bytes"].get<int64_t>(), f32["tokens"]["slot_bytes"].get<int64_t>());
  EXPECT_GT(f32["tokens"]["slot_bytes"].get<int64_t>(), 0);

  const ProcessResult refused = run_process(
      {EXPAR_BINARY, "plan", "--preset", "mixtral-8x7b", "--precision", "bf16", "--param-dtype", "f32"}, {},
      120);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("--precision bf16 sets the parameters' precision as expar train holds them, "
                                "so --param-dtype contradicts it: drop --param-dtype"),
            std::string::npos)
      << refused.output;
}

TEST(InferencePrecision, AnotherValueIsRefusedNamingTheAcceptedOnes) {
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"generate"}, {"eval", "--data", "/nonexistent.bin"}, {"serve"}, {"bench", "generate"}}) {
    std::vector<std::string> argv = {EXPAR_BINARY};
    argv.insert(argv.end(), command.begin(), command.end());
    for (const char* part : {"--checkpoint", "/nonexistent", "--precision", "fp8"}) argv.push_back(part);
    const ProcessResult r = run_process(argv, {}, 60);
    EXPECT_EQ(r.exit_code, 1) << command[0] << "\n" << r.output;
    EXPECT_NE(r.output.find("--precision: 'fp8' is unknown: pass one of f32, bf16"), std::string::npos)
        << command[0] << "\n"
        << r.output;
  }
}

TEST(InferencePrecision, Bf16IsRefusedWithoutBf16DotProductsAndTheFixRuns) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("expar_inference_precision_" + std::to_string(::getpid()));
  const std::string run = (dir / "run").string();
  ASSERT_EQ(
      run_process(tiny_train({"--ranks", "1", "--ep", "1", "--path", "local", "--checkpoint", run}), {}, 120)
          .exit_code,
      0);
  std::vector<std::string> argv = {EXPAR_BINARY, "generate", "--checkpoint", run,   "--prompt", "In",
                                   "--tokens",   "4",        "--precision",  "bf16"};
  const ProcessResult refused = run_process(argv, {{"DNNL_MAX_CPU_ISA", "AVX2"}}, 120);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("--precision bf16 needs a CPU with BF16 dot products"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("use --precision f32"), std::string::npos) << refused.output;
  argv.back() = "f32";  // the fix the message names
  const ProcessResult fixed = run_process(argv, {{"DNNL_MAX_CPU_ISA", "AVX2"}}, 120);
  EXPECT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_NE(fixed.output.find("products f32"), std::string::npos) << fixed.output;
  if (bf16_native()) {
    argv.back() = "bf16";
    const ProcessResult bf16 = run_process(argv, {}, 120);
    EXPECT_EQ(bf16.exit_code, 0) << bf16.output;
    EXPECT_NE(bf16.output.find("products bf16"), std::string::npos) << bf16.output;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace expar
