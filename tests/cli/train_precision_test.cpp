// `expar train --precision f32|bf16` run as a user would: refused by name, with the reason, where oneDNN
// has no BF16 dot products (checked on any machine by capping oneDNN's ISA with DNNL_MAX_CPU_ISA: AVX2, the
// AMD kind this project also runs on, and AVX512_CORE, AVX-512 without BF16); and, where the CPU has them,
// the payload flags default to bf16 with BF16 products unless one is given, on the paths that move
// reduced-precision rows.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace expar
