// Router: selection rules (ties, groups, selection-only bias), weights, the two auxiliary losses, every
// gradient by central finite differences, the bias update, and configuration errors.
#include "expar/moe/router.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/score_bias.hpp"

namespace expar {
namespace {

Tensor from(Shape shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor identity(int n) {
  Tensor t = Tensor::zeros({n, n});
  for (int i = 0; i < n; ++i) t.data<float>()[i * n + i] = 1.0f;
  return t;
}

std::vector<int> idx_row(const RouterOutput& out, int64_t t) {
  const int k = static_cast<int>(out.topk_idx.dim(1));
  return {out.topk_idx.data<int32_t>() + t * k, out.topk_idx.data<int32_t>() + (t + 1) * k};
}

TEST(Router, TiesGoToTheLowerExpertIndex) {
  RouterConfig c{.num_experts = 6, .top_k = 3};
  RouterState s;
  // Zero router weight: every score is 1/6; then a row with a tie between experts 4 and 2 at the top.
  Tensor x = from({2, 6}, {0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 2, 1});
  Tensor w = identity(6);
  w.data<float>()[0] = 0.0f;
  Tensor zero_w = Tensor::zeros({6, 6});
  auto out0 = router_forward(c, x, zero_w, nullptr, s);
  EXPECT_EQ(idx_row(out0, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_FLOAT_EQ(out0.topk_weight.data<float>()[0], 1.0f / 6.0f);
  auto out = router_forward(c, x, identity(6), nullptr, s);
  EXPECT_EQ(idx_row(out, 1), (std::vector<int>{2, 4, 1}));
}

TEST(Router, GroupLimitedRoutingPicksTheBestGroups) {
  // Identity router weight: the logits are x. Groups of 2: {0,1} {2,3} {4,5} {6,7}.
  Tensor x = from({1, 8}, {3.0f, -5.0f, 2.9f, -5.0f, 1.0f, 1.0f, 0.9f, 0.9f});
  RouterState s;
  RouterConfig sig{
      .num_experts = 8, .top_k = 2, .score = ScoreFunction::Sigmoid, .n_group = 4, .topk_group = 2};
  // Sigmoid group score = sum of the top 2: {0.957, 0.955, 1.462, 1.422}: groups 2 and 3 win, and the tie
  // between experts 4 and 5 goes to 4 first.
  EXPECT_EQ(idx_row(router_forward(sig, x, identity(8), nullptr, s), 0), (std::vector<int>{4, 5}));
  RouterConfig soft = sig;
  soft.score = ScoreFunction::Softmax;
  // Softmax group score = max: groups 0 and 1 win.
  EXPECT_EQ(idx_row(router_forward(soft, x, identity(8), nullptr, s), 0), (std::vector<int>{0, 2}));
  RouterConfig plain = sig;
  plain.n_group = 1;
  EXPECT_EQ(idx_row(router_forward(plain, x, identity(8), nullptr, s), 0), (std::vector<int>{0, 2}));
}

TEST(Router, BiasChangesSelectionButNotWeights) {
  RouterConfig c{.num_experts = 4, .top_k = 2, .score = ScoreFunction::Sigmoid};
  Tensor x = from({1, 4}, {2.0f, 1.0f, 0.0f, -1.0f});
  Tensor bias = from({4}, {0.0f, 0.0f, 0.0f, 0.9f});
  RouterState s;
  auto out = router_forward(c, x, identity(4), &bias, s);
  // Selection scores: 0.881, 0.731, 0.5, 0.269 + 0.9 = 1.169: expert 3 first, then 0 (descending order).
  EXPECT_EQ(idx_row(out, 0), (std::vector<int>{3, 0}));
  EXPECT_FLOAT_EQ(out.topk_weight.data<float>()[0], static_cast<float>(1.0 / (1.0 + std::exp(1.0))));
  EXPECT_FLOAT_EQ(out.topk_weight.data<float>()[1], static_cast<float>(1.0 / (1.0 + std::exp(-2.0))));
  c.renormalize = true;
  out = router_forward(c, x, identity(4), &bias, s);
  EXPECT_NEAR(out.topk_weight.data<float>()[0] + out.topk_weight.data<float>()[1], 1.0f, 1e-6f);
}

TEST(Router, AuxiliaryLossesMatchTheirDefinitions) {
  const int t_count = 7, d = 5, e_count = 6, k_count = 2;
  Tensor x = Tensor::empty({t_count, d}), w = Tensor::empty({e_count, d});
  fill_normal(x, 1, 1, 1.0f);
  fill_normal(w, 1, 2, 1.0f);
  for (ScoreFunction fn : {ScoreFunction::Softmax, ScoreFunction::Sigmoid}) {
    RouterConfig c{.num_experts = e_count, .top_k = k_count, .score = fn};
    RouterState s;
    auto out = router_forward(c, x, w, nullptr, s);
    std::vector<double> f(e_count, 0.0), p(e_count, 0.0);
    double z = 0.0;
    for (int t = 0; t < t_count; ++t) {
      std::vector<double> l(e_count);
      double mx = -1e30, sum = 0.0;
      for (int e = 0; e < e_count; ++e) {
        for (int i = 0; i < d; ++i) l[e] += double(x.data<float>()[t * d + i]) * w.data<float>()[e * d + i];
        mx = std::max(mx, l[e]);
      }
      for (int e = 0; e < e_count; ++e) sum += std::exp(l[e] - mx);
      z += std::pow(mx + std::log(sum), 2) / t_count;
      for (int e = 0; e < e_count; ++e)
        p[e] += (fn == ScoreFunction::Softmax ? std::exp(l[e] - mx) / sum : 1.0 / (1.0 + std::exp(-l[e]))) /
                t_count;
      for (int k = 0; k < k_count; ++k)
        f[out.topk_idx.data<int32_t>()[t * k_count + k]] += 1.0 / (t_count * k_count);
    }
    double aux = 0.0;
    for (int e = 0; e < e_count; ++e) aux += double(e_count) / k_count * f[e] * p[e];
    EXPECT_NEAR(out.aux_loss, aux, 1e-5);
    EXPECT_NEAR(out.z_loss, z, 1e-4);
  }
}

// Central differences of L = Σ g·w + aux_coef·L_aux + z_coef·L_z w.r.t. x and W_r.
// With a logit bias (gpt-oss's router bias) its gradient is checked too.
// With `batches` > 1 the losses are over that many loss-scope batches of 3 tokens each (the sequences of the
// sequence-wise loss).
void check_router_gradients(RouterConfig c, bool with_bias, uint64_t seed, bool with_logit_bias = false,
                            int batches = 1) {
  const int t_count = batches == 1 ? 5 : 3 * batches, d = 4, e_count = c.num_experts, k_count = c.top_k;
  const RouterLossScope scope{nullptr, batches};
  Tensor x = Tensor::empty({t_count, d}), w = Tensor::empty({e_count, d}),
         g = Tensor::empty({t_count, k_count});
  Tensor bias = Tensor::empty({e_count});
  fill_normal(x, seed, 1, 1.0f);
  fill_normal(w, seed, 2, 1.0f);
  fill_normal(g, seed, 3, 1.0f);
  fill_normal(bias, seed, 4, 0.1f);
  const Tensor* b = with_bias ? &bias : nullptr;
  Tensor logit_bias = Tensor::empty({e_count});
  fill_normal(logit_bias, seed, 5, 0.5f);
  const Tensor* lb = with_logit_bias ? &logit_bias : nullptr;
  RouterState s;
  auto base = router_forward(c, x, w, b, s, lb, scope);
  Tensor grad_x = Tensor::zeros({t_count, d}), grad_w = Tensor::zeros({e_count, d}),
         grad_lb = Tensor::zeros({e_count});
  router_backward(c, s, w, g, grad_x, grad_w, with_logit_bias ? &grad_lb : nullptr);
  auto loss = [&]() {
    RouterState s2;
    auto out = router_forward(c, x, w, b, s2, lb, scope);
    for (int64_t i = 0; i < base.topk_idx.numel(); ++i)
      EXPECT_EQ(out.topk_idx.data<int32_t>()[i], base.topk_idx.data<int32_t>()[i]) << "selection changed";
    double l = c.aux_loss_coef * out.aux_loss + c.z_loss_coef * out.z_loss;
    for (int64_t i = 0; i < g.numel(); ++i)
      l += double(g.data<float>()[i]) * out.topk_weight.data<float>()[i];
    return l;
  };
  auto check = [&](Tensor& param, const Tensor& grad, const char* name) {
    for (int64_t i = 0; i < param.numel(); ++i) {
      float& v = param.data<float>()[i];
      const float keep = v, eps = 1e-3f;
      v = keep + eps;
      const double up = loss();
      v = keep - eps;
      const double down = loss();
      v = keep;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(grad.data<float>()[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << name << "[" << i << "]";
    }
  };
  check(x, grad_x, "x");
  check(w, grad_w, "w_router");
  if (with_logit_bias) check(logit_bias, grad_lb, "logit_bias");
}

TEST(RouterGradients, Softmax) {
  check_router_gradients({.num_experts = 6, .top_k = 2}, false, 11);
}
TEST(RouterGradients, SoftmaxRenormalisedWithLosses) {
  check_router_gradients(
      {.num_experts = 6, .top_k = 3, .renormalize = true, .aux_loss_coef = 0.5, .z_loss_coef = 0.1}, false,
      12);
}
TEST(RouterGradients, SoftmaxOverTopkWithLogitBiasAndLosses) {
  check_router_gradients(
      {.num_experts = 7, .top_k = 3, .softmax_over_topk = true, .aux_loss_coef = 0.4, .z_loss_coef = 0.1},
      false, 15, true);
}

// gpt-oss: the K largest logits (bias included) are chosen, and the weights are the softmax over those K.
TEST(Router, SoftmaxOverTopkSelectsOnTheBiasedLogitsAndWeighsThoseK) {
  const RouterConfig c{.num_experts = 4, .top_k = 2, .softmax_over_topk = true};
  const Tensor x = from({1, 4}, {0.5f, 2.0f, 1.0f, -1.0f});  // with W = I these are the logits
  const Tensor bias = from({4}, {1.0f, -0.5f, 0.0f, 3.0f});  // biased logits 1.5, 1.5, 1.0, 2.0
  RouterState s;
  const RouterOutput out = router_forward(c, x, identity(4), nullptr, s, &bias);
  EXPECT_EQ(idx_row(out, 0), (std::vector<int>{3, 0}));  // 2.0, then the tie 1.5/1.5 to the lower index
  const double w0 = 1.0 / (1.0 + std::exp(1.5 - 2.0));
  EXPECT_NEAR(out.topk_weight.data<float>()[0], w0, 1e-6);
  EXPECT_NEAR(out.topk_weight.data<float>()[1], 1.0 - w0, 1e-6);
}

TEST(RouterGradients, Sigmoid) {
  check_router_gradients(
      {.num_experts = 6, .top_k = 2, .score = ScoreFunction::Sigmoid, .aux_loss_coef = 0.3}, false, 13);
}
TEST(RouterGradients, SigmoidRenormalisedGroupedBiased) {
  check_router_gradients({.num_experts = 8,
                          .top_k = 2,
                          .score = ScoreFunction::Sigmoid,
                          .renormalize = true,
                          .n_group = 4,
                          .topk_group = 2,
                          .aux_loss_coef = 0.2,
                          .z_loss_coef = 0.05},
                         true, 14);
}

// DeepSeek-V3's router: sigmoid scores, groups, a selection bias, renormalised, then routed_scaling_factor.
TEST(RouterGradients, SigmoidGroupedBiasedScaled) {
  check_router_gradients({.num_experts = 8,
                          .top_k = 3,
                          .score = ScoreFunction::Sigmoid,
                          .renormalize = true,
                          .n_group = 4,
                          .topk_group = 2,
                          .routed_scale = 2.5,
                          .aux_loss_coef = 0.2},
                         true, 16);
  // DeepSeek-V2's greedy router: softmax scores, not renormalised, scaled.
  check_router_gradients({.num_experts = 6, .top_k = 2, .routed_scale = 16.0}, false, 17);
}

// DeepSeek's sequence-wise load-balancing loss (seq_aux; the V3 paper's complementary sequence-wise balance
// loss) on a hand-made example:
// E = 4, K = 2, the logits the tokens themselves (W = I), two sequences of T = 2 tokens as the two batches
// of the loss scope. f_e = E/(K·T) · count_e = count_e here; P_e the mean over the sequence's tokens of the
// scores normalised over the experts; L_aux the mean over the sequences of Σ_e f_e·P_e.
TEST(Router, SequenceWiseAuxLossIsDeepSeeksFormula) {
  const Tensor x = from({4, 4}, {2, 1, 0, -1,    // sequence 0: experts 0, 1
                                 0, 3, 1, -2,    //             1, 2
                                 -1, 0, 2, 1,    // sequence 1: 2, 3
                                 1, -1, 0, 2});  //             3, 0
  const std::vector<std::vector<double>> counts{{1, 2, 1, 0}, {1, 0, 1, 2}};
  for (ScoreFunction fn : {ScoreFunction::Sigmoid, ScoreFunction::Softmax}) {
    RouterConfig c{.num_experts = 4, .top_k = 2, .score = fn, .aux_loss_kind = AuxLossKind::Sequence};
    RouterState s;
    const RouterOutput out = router_forward(c, x, identity(4), nullptr, s, nullptr, {nullptr, 2});
    EXPECT_EQ(idx_row(out, 1), (std::vector<int>{1, 2}));
    EXPECT_EQ(idx_row(out, 3), (std::vector<int>{3, 0}));
    double want = 0.0, unnormalised = 0.0;
    for (int q = 0; q < 2; ++q) {
      for (int t = 2 * q; t < 2 * q + 2; ++t) {
        std::vector<double> score(4);
        double sum = 0.0, softmax_sum = 0.0;
        for (int e = 0; e < 4; ++e) softmax_sum += std::exp(double(x.data<float>()[t * 4 + e]));
        for (int e = 0; e < 4; ++e) {
          const double l = x.data<float>()[t * 4 + e];
          score[e] = fn == ScoreFunction::Sigmoid ? 1.0 / (1.0 + std::exp(-l)) : std::exp(l) / softmax_sum;
          sum += score[e];
        }
        // f_e = 4 / (2·2) · count_e; P_e = Σ_t s'_{t,e} / 2; the mean over the 2 sequences.
        for (int e = 0; e < 4; ++e) {
          want += counts[q][e] * score[e] / sum / 2 / 2;
          unnormalised += counts[q][e] * score[e] / 2 / 2;
        }
      }
    }
    EXPECT_NEAR(out.aux_loss, want, 1e-6) << score_function_name(fn);
    if (fn == ScoreFunction::Sigmoid) {
      EXPECT_GT(std::fabs(out.aux_loss - unnormalised), 0.1) << "sigmoid scores must be normalised";
    }
    // The same tokens as one batch (one sequence of 4) count differently: the loss is per sequence.
    const RouterOutput one = router_forward(c, x, identity(4), nullptr, s);
    EXPECT_GT(std::fabs(one.aux_loss - out.aux_loss), 1e-3) << score_function_name(fn);
  }
  // Balanced routing and balanced scores give 1 (the batch form's 1/K): f_e = 1, P_e = 1/E.
  RouterConfig c{.num_experts = 4, .top_k = 2, .aux_loss_kind = AuxLossKind::Sequence};
  const Tensor balanced = from({2, 4}, {1, 1, 0, 0, 0, 0, 1, 1});
  RouterState s;
  // The scores differ per token, but over the sequence each expert's mean is 1/4 by symmetry.
  EXPECT_NEAR(router_forward(c, balanced, identity(4), nullptr, s).aux_loss, 1.0, 1e-6);
}

TEST(RouterGradients, SequenceAuxSigmoidGroupedBiasedScaled) {
  // DeepSeek-V3's router with its sequence-wise loss over 2 sequences of 3 tokens.
  check_router_gradients({.num_experts = 8,
                          .top_k = 3,
                          .score = ScoreFunction::Sigmoid,
                          .renormalize = true,
                          .n_group = 4,
                          .topk_group = 2,
                          .routed_scale = 2.5,
                          .aux_loss_coef = 0.7,
                          .aux_loss_kind = AuxLossKind::Sequence,
                          .z_loss_coef = 0.05},
                         true, 18, false, 2);
  // DeepSeek-V2's: softmax, not renormalised, over 3 sequences.
  check_router_gradients({.num_experts = 6,
                          .top_k = 2,
                          .routed_scale = 16.0,
                          .aux_loss_coef = 0.9,
                          .aux_loss_kind = AuxLossKind::Sequence},
                         false, 19, false, 3);
  // Sigmoid without groups, one sequence.
  check_router_gradients({.num_experts = 6,
                          .top_k = 2,
                          .score = ScoreFunction::Sigmoid,
                          .aux_loss_coef = 1.0,
                          .aux_loss_kind = AuxLossKind::Sequence},
                         false, 20);
}

TEST(Router, RoutedScaleMultipliesTheWeightsLast) {
  Tensor x = from({1, 4}, {2.0f, 1.0f, 0.0f, -1.0f});
  RouterConfig c{.num_experts = 4, .top_k = 2, .score = ScoreFunction::Sigmoid, .renormalize = true};
  RouterState s;
  const RouterOutput plain = router_forward(c, x, identity(4), nullptr, s);
  c.routed_scale = 2.5;
  const RouterOutput scaled = router_forward(c, x, identity(4), nullptr, s);
  EXPECT_EQ(idx_row(plain, 0), idx_row(scaled, 0));
  const double s0 = 1.0 / (1.0 + std::exp(-2.0)), s1 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(scaled.topk_weight.data<float>()[0], 2.5 * s0 / (s0 + s1), 1e-6);
  EXPECT_NEAR(scaled.topk_weight.data<float>()[1], 2.5 * s1 / (s0 + s1), 1e-6);
}

TEST(ScoreBias, MovesTowardsBalance) {
  std::vector<float> bias{0.0f, 0.0f, 0.5f, 0.0f};
  std::vector<int64_t> counts{4, 0, 2, 2};  // mean 2
  update_score_bias(bias, counts, 0.25f);
  EXPECT_EQ(bias, (std::vector<float>{-0.25f, 0.25f, 0.5f, 0.0f}));
}

TEST(RouterConfig, BadConfigurationsAreClearErrors) {
  auto message = [](RouterConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.num_experts = 4, .top_k = 5}).find("top_k=5"), std::string::npos);
  EXPECT_NE(message({.num_experts = 4, .top_k = 0}).find("top_k=0"), std::string::npos);
  EXPECT_NE(message({.num_experts = 6, .top_k = 2, .n_group = 4, .topk_group = 1}).find("n_group=4"),
            std::string::npos);
  EXPECT_NE(message({.num_experts = 8, .top_k = 3, .n_group = 4, .topk_group = 1}).find("topk_group"),
            std::string::npos);
  EXPECT_EQ(message({.num_experts = 8, .top_k = 2, .n_group = 4, .topk_group = 1}), "");
  EXPECT_NE(message({.num_experts = 4, .top_k = 2, .routed_scale = 0.0}).find("routed_scale=0"),
            std::string::npos);
  EXPECT_NE(message({.num_experts = 4, .top_k = 2, .softmax_over_topk = true, .routed_scale = 2.0})
                .find("softmax_over_topk"),
            std::string::npos);
  EXPECT_THROW(score_function_from_name("relu"), Error);
}

// What a user can cause (non-finite weights or inputs) is an Error with the value; a router weight of
// another shape than the layer built is a bug in the caller, an InternalError naming the condition.
TEST(Router, UserErrorsAndBrokenInvariantsReadDifferently) {
  const RouterConfig c{.num_experts = 4, .top_k = 2};
  RouterState s;
  const Tensor x = from({1, 4}, {1, 0, 0, 0});
  Tensor w = identity(4);
  w.data<float>()[0] = NAN;
  try {
    router_forward(c, x, w, nullptr, s);
    ADD_FAILURE() << "a NaN logit went through";
  } catch (const InternalError& e) {
    ADD_FAILURE() << "a non-finite weight is the user's input, not a bug: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router logit of token 0 for expert 0 is nan"), std::string::npos)
        << e.what();
  }
  try {
    router_forward(c, x, identity(3), nullptr, s);
    ADD_FAILURE() << "a [3, 3] router weight for 4 experts went through";
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("internal error at"), std::string::npos) << m;
    EXPECT_NE(m.find("router.cpp"), std::string::npos) << m;
    EXPECT_NE(m.find("router weight has shape [3, 3], expected [4, 4]"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace expar
