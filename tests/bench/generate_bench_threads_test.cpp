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
#include "expar/core/error.hpp"
#include "infer/deepseek_test_model.hpp"

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

// --router-skew and --redundant-experts: the per-rank load is a fraction in [0, ranks - 1] per layer, and
// with replicas the move EPLB chose is reported with its bytes (the experts are f32 [E, 12, 40] x 3 per
// layer: whole slots of 3 * 12 * 40 floats) and time; a bad skew is refused before loading.
TEST_F(GenerateBench, SkewAndReplicasReportTheLoadPerRankAndTheMove) {
  GenerateBenchOptions o;
  o.path = dir_->string();
  o.engine.tp = 2;
  o.engine.enable_expert_parallel = true;
  o.prompt_tokens = 28;  // max_seq 32
  o.tokens = 3;
  o.warmup = 0;
  o.repeats = 1;
  o.router_skew = 1.0;
  const GenerateBenchReport plain = run_generate_bench(o);
  o.engine.redundant_experts = 2;
  const GenerateBenchReport replicas = run_generate_bench(o);
  for (const GenerateBenchReport* r : {&plain, &replicas}) {
    expect_sane(*r);
    for (double v :
         {r->prefill_imbalance, r->prefill_imbalance_max, r->decode_imbalance, r->decode_imbalance_max}) {
      EXPECT_GE(v, 0.0);
      EXPECT_LE(v, 1.0);  // (max - mean) / mean of 2 ranks
    }
    EXPECT_LE(r->prefill_imbalance, r->prefill_imbalance_max);
  }
  EXPECT_FALSE(plain.rebalanced);
  EXPECT_EQ(plain.moved_bytes, 0);
  if (replicas.rebalanced) {
    const int64_t slot_bytes = 3 * 12 * 40 * 4;
    EXPECT_GT(replicas.moved_bytes, 0);
    EXPECT_EQ(replicas.moved_bytes % slot_bytes, 0) << replicas.moved_bytes;
    EXPECT_GT(replicas.move_seconds, 0.0);
  } else {
    EXPECT_EQ(replicas.moved_bytes, 0);
  }
  o.eplb_prompts = 0;
  try {
    run_generate_bench(o);
    ADD_FAILURE() << "--eplb-prompts 0 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--eplb-prompts 0 must be at least 1"), std::string::npos)
        << e.what();
  }
  o.eplb_prompts = 1;
  o.router_skew = -1;
  try {
    run_generate_bench(o);
    ADD_FAILURE() << "--router-skew -1 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--router-skew -1"), std::string::npos) << e.what();
  }
}

// DeepSeek-V3 (latent attention, a dense first layer, shared experts): the limits count the expanded
// prefill's products, layer by layer, and the report names the latent cache beside the expanded one.
TEST(GenerateBenchDeepseek, CountsLatentAttentionAndDenseLayers) {
  const fs::path dir = test::make_temp_dir("generate_bench_deepseek");
  const infer::testing::DeepseekTestModel m = infer::testing::deepseek_v3_test_model();
  m.write(dir);
  int64_t checkpoint_bytes = 0;
  for (const auto& [name, t] : m.tensors) checkpoint_bytes += static_cast<int64_t>(t.nbytes());
  GenerateBenchOptions o;
  o.path = dir.string();
  o.prompt_tokens = 5;
  o.tokens = 3;
  o.warmup = 0;
  o.repeats = 1;
  const GenerateBenchReport one = run_generate_bench(o);
  for (const double v : {one.prefill_tokens_per_s, one.decode_tokens_per_s, one.prefill_matmul_fraction,
                         one.decode_bandwidth_fraction, one.decode_bytes_per_token})
    EXPECT_TRUE(std::isfinite(v) && v > 0.0) << v;
  EXPECT_EQ(one.weight_bytes, checkpoint_bytes);
  // The prefill's FLOPs, counted independently: per layer the latent attention (q LoRA, latent, expansion,
  // causal scores and values per head, output), then the dense MLP (layer 0) or the router, each local
  // expert at max(1, P·K/E) rows and the shared experts; the LM head of the last row.
  const double p = 5, d = 32, h = 4, ql = 12, kl = 16, nope = 6, rope = 4, v = 5, qk = nope + rope;
  const double attention =
      2 * p * (ql * d + h * qk * ql + (kl + rope) * d + h * (nope + v) * kl + d * h * v) +
      h * (p * p * qk + p * v * p);
  const double dense = 2 * p * 3 * 24 * d;
  const double moe = 2 * p * 8 * d + 8 * 2 * 1 * 3 * 8 * d + 2 * p * 3 * 16 * d;
  EXPECT_DOUBLE_EQ(one.prefill_flops, 3 * attention + dense + 2 * moe + 2 * 1 * 64 * d);
  EXPECT_EQ(one.kv_bytes_per_token, 3 * (16 + 4) * 4);
  EXPECT_EQ(one.kv_bytes_per_token_expanded, 3 * 4 * (10 + 5) * 4);
  o.engine.tp = 2;
  o.engine.enable_expert_parallel = true;
  const GenerateBenchReport two = run_generate_bench(o);
  EXPECT_EQ(two.kv_bytes_per_token, 3 * (16 + 4) * 4);  // the latent is whole on every TP rank
  EXPECT_EQ(two.kv_bytes_per_token_expanded, 3 * 2 * (10 + 5) * 4);
  EXPECT_LT(two.decode_bytes_per_token, one.decode_bytes_per_token);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace expar::bench
