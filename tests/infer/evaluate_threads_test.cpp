// evaluate() (expar eval): the mean next-token loss over a token stream equals the dense double reference's
// (windows of max_position_embeddings tokens overlapping by one), on every layout TP 1..4 x {no EP, full EP}
// x DP {1, 2} equal to the single-rank result; windows, --tokens-like truncation and bad tokens.
#include <gtest/gtest.h>

#include "expar/infer/evaluate.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;

// The dense model's mean loss, in double, over windows of `window` + 1 tokens overlapping by one.
double dense_mean_loss(const HfTestModel& m, const std::vector<int32_t>& tokens, int64_t window) {
  const auto predicted = static_cast<int64_t>(tokens.size()) - 1;
  double sum = 0.0;
  for (int64_t first = 0; first < predicted; first += window) {
    const int64_t n = std::min(window, predicted - first);
    const std::vector<int32_t> input(tokens.begin() + first, tokens.begin() + first + n);
    const Tensor logits = m.dense_logits(input);
    for (int64_t t = 0; t < n; ++t) {
      // log-sum-exp written out here in double (not token_loss, the function under test)
      const float* row = logits.data<float>() + t * m.vocab;
      double mx = row[0], z = 0.0;
      for (int v = 1; v < m.vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int v = 0; v < m.vocab; ++v) z += std::exp(row[v] - mx);
      sum += mx + std::log(z) - row[tokens[static_cast<size_t>(first + t + 1)]];
    }
  }
  return sum / static_cast<double>(predicted);
}

struct Fixture {
  HfTestModel model = qwen3_moe_test_model();
  fs::path dir = test::run_temp_dir("eval_qwen3");
  std::vector<int32_t> tokens = vocab_tokens(77, 70, 64);
  Fixture() { model.write(dir); }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

TEST(Evaluate, EveryLayoutMatchesTheSingleRankAndTheDenseReference) {
  const Fixture& f = fixture();
  const double dense = dense_mean_loss(f.model, f.tokens, f.model.max_seq);
  const EvaluateResult one = evaluate({}, f.dir.string(), f.tokens);
  EXPECT_EQ(one.format, ModelFormat::Qwen3Moe);
  EXPECT_EQ(one.predicted, 69);
  EXPECT_EQ(one.windows, 3);  // 32 + 32 + 5 predicted tokens
  EXPECT_NEAR(one.mean_loss, dense, 1e-5 * dense);
  EXPECT_NEAR(one.perplexity, std::exp(dense), 1e-5 * std::exp(dense));
  EXPECT_GT(one.mean_loss, 0.5);  // a random model: far from certain
  for (int dp = 1; dp <= 2; ++dp)
    for (int tp = 1; tp <= 4; ++tp)
      for (bool ep : {false, true}) {
        EvaluateOptions o;
        o.engine.tp = tp;
        o.engine.dp = dp;
        o.engine.enable_expert_parallel = ep;
        const EvaluateResult r = evaluate(o, f.dir.string(), f.tokens);
        EXPECT_NEAR(r.mean_loss, one.mean_loss, 1e-5 * one.mean_loss)
            << "TP " << tp << " DP " << dp << (ep ? " full EP" : " no EP");
        EXPECT_EQ(r.predicted, one.predicted);
      }
  // Redundant experts (`expar eval --redundant-experts R`): full, variable and cross-DP EP.
  struct Replicas {
    int tp, dp, ep, redundant;
  };
  for (const Replicas& c : {Replicas{2, 1, 0, 2}, Replicas{4, 1, 2, 2}, Replicas{2, 2, 0, 4}}) {
    EvaluateOptions o;
    o.engine.tp = c.tp;
    o.engine.dp = c.dp;
    o.engine.enable_expert_parallel = true;
    if (c.ep > 0) o.engine.ep_degree = c.ep;
    o.engine.redundant_experts = c.redundant;
    const EvaluateResult r = evaluate(o, f.dir.string(), f.tokens);
    EXPECT_NEAR(r.mean_loss, one.mean_loss, 1e-5 * one.mean_loss)
        << "TP " << c.tp << " DP " << c.dp << " EP " << c.ep << " R " << c.redundant;
    EXPECT_EQ(r.predicted, one.predicted);
  }
}

TEST(Evaluate, WindowsAndTruncation) {
  const Fixture& f = fixture();
  EvaluateOptions o;
  o.window = 8;
  const EvaluateResult r = evaluate(o, f.dir.string(), f.tokens);
  EXPECT_EQ(r.windows, 9);  // 69 predicted tokens in windows of 8
  const double dense8 = dense_mean_loss(f.model, f.tokens, 8);
  EXPECT_NEAR(r.mean_loss, dense8, 1e-5 * dense8);
  const std::vector<int32_t> head(f.tokens.begin(), f.tokens.begin() + 10);
  const EvaluateResult h = evaluate({}, f.dir.string(), head);
  EXPECT_EQ(h.predicted, 9);
  EXPECT_NEAR(h.mean_loss, dense_mean_loss(f.model, head, 32), 1e-5 * h.mean_loss);
  EXPECT_NEAR(token_loss(std::vector<float>{0.0f, 0.0f}.data(), 2, 1), std::log(2.0), 1e-12);
}

TEST(Evaluate, BadInputIsRefusedByName) {
  const Fixture& f = fixture();
  std::vector<int32_t> bad = f.tokens;
  bad[41] = 64;  // the vocabulary is 64
  try {
    evaluate({}, f.dir.string(), bad);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("token 41"), std::string::npos) << m;
    EXPECT_NE(m.find("value 64"), std::string::npos) << m;
  }
  EXPECT_THROW(evaluate({}, f.dir.string(), {3}), Error);
  EvaluateOptions o;
  o.window = 33;  // beyond max_position_embeddings 32
  EXPECT_THROW(evaluate(o, f.dir.string(), f.tokens), Error);
}

}  // namespace
}  // namespace expar::infer
