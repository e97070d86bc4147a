// expar bench generate measures the product engine beside its limits. These runs check what the report
// must say whatever the machine's speed: every figure positive and finite, the weights it held summed over
// ranks equal to the checkpoint's (TP 1) or more (TP 2 replicates the norms and the router), and a
// one-token prompt whose LM head row is wider than any of the prompt's products (the limits' scratch
// operands must fit it: they once overflowed, seen under ASan).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "common/temp_dir.hpp"
#include "expar/bench/generate.hpp"
#include "infer/hf_test_models.hpp"

namespace expar::bench {
namespace {

namespace fs = std::filesystem;

class GenerateBench : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::make_temp_dir("generate_bench"));
    infer::testing::HfTestModel m = infer::testing::mixtral_test_model();
    m.vocab = 2000;  // one row of logits (2000) outgrows every product of a one-token prompt (d = 40)
    m.randomize(61);
    m.write(*dir_);
    for (const auto& [name, t] : m.tensors) checkpoint_bytes_ += static_cast<int64_t>(t.nbytes());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static GenerateBenchReport run(int tp, int64_t prompt_tokens) {
    GenerateBenchOptions o;
    o.path = dir_->string();
    o.engine.tp = tp;
    o.engine.enable_expert_parallel = tp > 1;
    o.prompt_tokens = prompt_tokens;
    o.tokens = 3;
    o.warmup = 0;
    o.repeats = 1;
    return run_generate_bench(o);
  }

  static void expect_sane(const GenerateBenchReport& r) {
    for (const double v :
         {r.prefill_tokens_per_s, r.decode_tokens_per_s, r.prefill_matmul_fraction,
          r.decode_bandwidth_fraction, r.read_bandwidth, r.matmul_flops, r.decode_bytes_per_token}) {
      EXPECT_TRUE(std::isfinite(v)) << v;
      EXPECT_GT(v, 0.0);
    }
  }

  static inline fs::path* dir_ = nullptr;
  static inline int64_t checkpoint_bytes_ = 0;
};

TEST_F(GenerateBench, OneTokenPromptAtTp1HoldsTheCheckpointsBytes) {
  const GenerateBenchReport r = run(1, 1);
  expect_sane(r);
  EXPECT_EQ(r.weight_bytes, checkpoint_bytes_);
  // A decode step reads at most every weight once plus its KV cache, and at least the LM head.
  EXPECT_LT(r.decode_bytes_per_token, static_cast<double>(checkpoint_bytes_));
  EXPECT_GT(r.decode_bytes_per_token, 2000.0 * 40 * sizeof(float));
}

TEST_F(GenerateBench, Tp2SplitsTheBytesAStepReads) {
  const GenerateBenchReport one = run(1, 5), two = run(2, 5);
  expect_sane(two);
  EXPECT_EQ(two.ranks, 2);
  EXPECT_GT(two.weight_bytes, checkpoint_bytes_);
  EXPECT_LT(two.decode_bytes_per_token, 0.75 * one.decode_bytes_per_token);
}

}  // namespace
}  // namespace expar::bench
