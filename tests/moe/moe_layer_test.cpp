// The MoE layer on one rank with the `local` path: against a dense f64 computation (every token through its
// K experts one by one), every gradient by central finite differences, capacity drops, NaN-poisoned buffers,
// edge cases and configuration errors. Every float tensor of this binary starts as NaN (EXPAR_POISON=1), so
// a read of memory nobody wrote shows up as a non-finite result.
#include "expar/moe/moe_layer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "solo_comm.hpp"

namespace expar {
namespace {

const bool kPoisonSet = [] { return setenv("EXPAR_POISON", "1", 1) == 0; }();

using testing::SoloComm;

MoeConfig small_config(int e_count = 4, int k = 2) {
  MoeConfig c;
  c.router.num_experts = e_count;
  c.router.top_k = k;
  c.model_dim = 4;
  c.hidden_dim = 3;
  return c;
}

Tensor random_x(int64_t t, int64_t d, uint64_t seed) {
  Tensor x = Tensor::empty({t, d});
  fill_normal(x, seed, 77, 1.0f);
  return x;
}

double silu(double a) {
  return a / (1.0 + std::exp(-a));
}

// y[t] = Σ_k w[t,k]·expert(x_t) for the accepted routes, all in f64, with its own router (no bias, no
// groups).
struct DenseResult {
  std::vector<double> y;
  std::vector<int> idx;
  std::vector<double> weight;
};
DenseResult dense_reference(const MoeConfig& c, const MoeParams& p, const Tensor& x, const RouteMap& map) {
  const int64_t t_count = x.dim(0), d = c.model_dim, h = c.hidden_dim;
  const int e_count = c.router.num_experts, k_count = c.router.top_k;
  DenseResult r;
  r.y.assign(static_cast<size_t>(t_count * d), 0.0);
  const float* xs = x.data<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<double> l(static_cast<size_t>(e_count), 0.0), s(static_cast<size_t>(e_count));
    for (int e = 0; e < e_count; ++e)
      for (int64_t i = 0; i < d; ++i)
        l[static_cast<size_t>(e)] += double(xs[t * d + i]) * p.w_router.data<float>()[e * d + i];
    const double mx = *std::max_element(l.begin(), l.end());
    double sum = 0.0;
    for (double v : l) sum += std::exp(v - mx);
    for (int e = 0; e < e_count; ++e)
      s[static_cast<size_t>(e)] = c.router.score == ScoreFunction::Softmax
                                      ? std::exp(l[static_cast<size_t>(e)] - mx) / sum
                                      : 1.0 / (1.0 + std::exp(-l[static_cast<size_t>(e)]));
    std::vector<int> order(static_cast<size_t>(e_count));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
    double ksum = 0.0;
    for (int k = 0; k < k_count; ++k) ksum += s[static_cast<size_t>(order[static_cast<size_t>(k)])];
    for (int k = 0; k < k_count; ++k) {
      const int e = order[static_cast<size_t>(k)];
      const double w = c.router.renormalize ? s[static_cast<size_t>(e)] / ksum : s[static_cast<size_t>(e)];
      r.idx.push_back(e);
      r.weight.push_back(w);
      if (!map.valid(t, k)) continue;
      std::vector<double> act(static_cast<size_t>(h));
      for (int64_t j = 0; j < h; ++j) {
        double a = 0.0, b = 0.0;
        for (int64_t i = 0; i < d; ++i) {
          a += double(p.experts.w1.data<float>()[(e * h + j) * d + i]) * xs[t * d + i];
          b += double(p.experts.w3.data<float>()[(e * h + j) * d + i]) * xs[t * d + i];
        }
        act[static_cast<size_t>(j)] = silu(a) * b;
      }
      for (int64_t i = 0; i < d; ++i) {
        double o = 0.0;
        for (int64_t j = 0; j < h; ++j)
          o += double(p.experts.w2.data<float>()[(e * d + i) * h + j]) * act[static_cast<size_t>(j)];
        r.y[static_cast<size_t>(t * d + i)] += w * o;
      }
    }
  }
  return r;
}

// Returns the number of dropped routes.
int64_t expect_matches_dense(const MoeConfig& c, int64_t t_count, uint64_t seed, const MoeExecution& e = {}) {
  SoloComm comm;
  MoeLayer layer(c, e, comm);
  layer.init_params(seed);
  Tensor x = random_x(t_count, c.model_dim, seed);
  MoeState state;
  Tensor y = layer.forward(x, state);
  DenseResult ref = dense_reference(c, layer.params(), x, state.routes);
  EXPECT_EQ(y.dim(0), t_count);
  for (int64_t i = 0; i < t_count * c.router.top_k; ++i) {
    EXPECT_EQ(state.router.topk_idx.data<int32_t>()[i], ref.idx[static_cast<size_t>(i)]) << "route " << i;
    EXPECT_NEAR(state.router.topk_weight.data<float>()[i], ref.weight[static_cast<size_t>(i)], 1e-6)
        << "route " << i;
  }
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_NEAR(y.data<float>()[i], ref.y[static_cast<size_t>(i)],
                1e-5 + 1e-5 * std::fabs(ref.y[static_cast<size_t>(i)]))
        << "y[" << i << "]";
  return state.metrics.dropped;
}

TEST(MoeLayerDense, SoftmaxTop2) {
  expect_matches_dense(small_config(), 7, 1);
}
TEST(MoeLayerDense, SigmoidRenormalised) {
  MoeConfig c = small_config(6, 3);
  c.router.score = ScoreFunction::Sigmoid;
  c.router.renormalize = true;
  expect_matches_dense(c, 9, 2);
}
TEST(MoeLayerDense, TopOne) {
  expect_matches_dense(small_config(4, 1), 5, 3);
}
TEST(MoeLayerDense, TopKEqualsE) {
  MoeConfig c = small_config(4, 4);
  c.router.renormalize = true;
  expect_matches_dense(c, 5, 4);
}
TEST(MoeLayerDense, SourceCapacityDrops) {
  MoeExecution e;
  e.capacity = CapacityPolicy::with(CapacityRule::Source, 0.5);
  EXPECT_GT(expect_matches_dense(small_config(4, 2), 8, 5, e), 0);
}

// Central differences of L = Σ R⊙y + aux_coef·L_aux + z_coef·L_z with respect to x and every parameter.
// Returns the number of dropped routes.
int64_t check_layer_gradients(const MoeConfig& c, int64_t t_count, uint64_t seed,
                              const MoeExecution& e = {}) {
  SoloComm comm;
  MoeLayer layer(c, e, comm);
  layer.init_params(seed);
  if (c.use_score_bias) fill_normal(layer.params().score_bias, seed, 5, 0.05f);
  Tensor x = random_x(t_count, c.model_dim, seed);
  Tensor proj = Tensor::empty({t_count, c.model_dim});
  fill_normal(proj, seed, 78, 1.0f);
  MoeState state;
  layer.forward(x, state);
  const Tensor base_rows = state.routes.dst_row.clone();
  layer.zero_grads();
  Tensor grad_x = layer.backward(proj, state);
  auto loss = [&]() {
    MoeState s;
    Tensor y = layer.forward(x, s);
    for (int64_t i = 0; i < base_rows.numel(); ++i)
      EXPECT_EQ(s.routes.dst_row.data<int32_t>()[i], base_rows.data<int32_t>()[i]) << "routes changed";
    double l = c.router.aux_loss_coef * s.metrics.aux_loss + c.router.z_loss_coef * s.metrics.z_loss;
    for (int64_t i = 0; i < y.numel(); ++i) l += double(y.data<float>()[i]) * proj.data<float>()[i];
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
  check(layer.params().w_router, layer.grads().w_router, "w_router");
  check(layer.params().experts.w1, layer.grads().experts.w1, "w1");
  check(layer.params().experts.w3, layer.grads().experts.w3, "w3");
  check(layer.params().experts.w2, layer.grads().experts.w2, "w2");
  return state.metrics.dropped;
}

TEST(MoeLayerGradients, SoftmaxTop2) {
  check_layer_gradients(small_config(), 6, 21);
}
TEST(MoeLayerGradients, SoftmaxRenormalisedWithAuxAndZLoss) {
  MoeConfig c = small_config(4, 2);
  c.router.renormalize = true;
  c.router.aux_loss_coef = 0.5;
  c.router.z_loss_coef = 0.1;
  check_layer_gradients(c, 6, 22);
}
TEST(MoeLayerGradients, SigmoidGroupedBiasedWithDrops) {
  MoeConfig c = small_config(8, 2);
  c.router.score = ScoreFunction::Sigmoid;
  c.router.renormalize = true;
  c.router.n_group = 4;
  c.router.topk_group = 2;
  c.use_score_bias = true;
  c.router.aux_loss_coef = 0.2;
  MoeExecution e;
  e.capacity = CapacityPolicy::with(CapacityRule::Expert, 0.75);
  EXPECT_GT(check_layer_gradients(c, 8, 23, e), 0);
}

// Every token prefers experts 0 then 1 (x > 0, router rows +10, +5, -5, -10).
void force_routes(MoeLayer& layer, Tensor& x) {
  float* xs = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) xs[i] = 0.5f + std::fabs(xs[i]);
  const float rows[] = {10.0f, 5.0f, -5.0f, -10.0f};
  const int64_t d = layer.config().model_dim;
  for (int e = 0; e < 4; ++e)
    for (int64_t i = 0; i < d; ++i)
      layer.params().w_router.data<float>()[e * d + i] = rows[e] / static_cast<float>(d);
}

TEST(MoeLayerDrops, DroppedRoutesAreExactlyThePolicysAndContributeNothing) {
  ASSERT_TRUE(poison_enabled());
  for (CapacityRule rule : {CapacityRule::Source, CapacityRule::Rank, CapacityRule::Expert}) {
    MoeConfig c = small_config(4, 2);
    MoeExecution e;
    e.capacity = CapacityPolicy::with(rule, 0.25);
    SoloComm comm;
    MoeLayer layer(c, e, comm);
    layer.init_params(31);
    const int64_t t_count = 6, d = c.model_dim;
    Tensor x = random_x(t_count, d, 31);
    force_routes(layer, x);
    MoeState state;
    Tensor y = layer.forward(x, state);
    // Every token routes (expert 0, expert 1). T·K = 12.
    //  source/rank (one rank): ceil(0.25·6·2) = 3 rows, expert 0 first: tokens 0-2 keep their k=0 route.
    //  expert: ceil(0.25·6·2/4) = 1 row per expert: only token 0 keeps both routes.
    std::vector<std::vector<bool>> keep(t_count, {false, false});
    if (rule == CapacityRule::Expert) {
      keep[0] = {true, true};
    } else {
      for (int t = 0; t < 3; ++t) keep[static_cast<size_t>(t)][0] = true;
    }
    int64_t kept = 0;
    for (int64_t t = 0; t < t_count; ++t)
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(state.router.topk_idx.data<int32_t>()[t * 2 + k], k);
        EXPECT_EQ(state.routes.valid(t, k), keep[static_cast<size_t>(t)][static_cast<size_t>(k)])
            << capacity_rule_name(rule) << " token " << t << " k " << k;
        kept += keep[static_cast<size_t>(t)][static_cast<size_t>(k)];
      }
    EXPECT_EQ(state.metrics.dropped, 12 - kept);
    EXPECT_DOUBLE_EQ(state.metrics.drop_rate, double(12 - kept) / 12.0);
    EXPECT_DOUBLE_EQ(state.metrics.utilisation, double(kept) / double(state.routes.capacity_rows));
    // The capacity tail of the dispatch buffer is still poison: nobody wrote it.
    const Tensor& in = state.experts.input;
    for (int64_t i = state.routes.recv_rows * d; i < state.routes.capacity_rows * d; ++i)
      EXPECT_TRUE(std::isnan(in.data<float>()[i]));
    if (rule == CapacityRule::Expert) {
      EXPECT_GT(state.routes.capacity_rows, state.routes.recv_rows);
    }
    // Dropped routes contribute zero; tokens without any accepted route give exactly 0 and get exactly 0.
    DenseResult ref = dense_reference(c, layer.params(), x, state.routes);
    Tensor grad_y = random_x(t_count, d, 32);
    layer.zero_grads();
    Tensor grad_x = layer.backward(grad_y, state);
    for (int64_t t = 0; t < t_count; ++t)
      for (int64_t i = 0; i < d; ++i) {
        const float yv = y.data<float>()[t * d + i], gx = grad_x.data<float>()[t * d + i];
        EXPECT_NEAR(yv, ref.y[static_cast<size_t>(t * d + i)], 1e-5);
        EXPECT_TRUE(std::isfinite(gx));
        if (!keep[static_cast<size_t>(t)][0] && !keep[static_cast<size_t>(t)][1]) {
          EXPECT_EQ(yv, 0.0f);
          EXPECT_EQ(gx, 0.0f);
        }
      }
    // The weight gradient of a dropped route is zero; of a kept one, not.
    Tensor grad_w;
    PathState replay = state.path;
    layer.path().combine_backward(grad_y, state.router.topk_weight, state.routes, replay, grad_w);
    for (int64_t t = 0; t < t_count; ++t)
      for (int k = 0; k < 2; ++k) {
        if (keep[static_cast<size_t>(t)][static_cast<size_t>(k)]) {
          EXPECT_NE(grad_w.data<float>()[t * 2 + k], 0.0f);
        } else {
          EXPECT_EQ(grad_w.data<float>()[t * 2 + k], 0.0f);
        }
      }
    // Experts that received nothing (2, 3; and 1 except under the expert rule) have zero gradients.
    const int64_t per = c.hidden_dim * d;
    for (int e = (rule == CapacityRule::Expert ? 2 : 1); e < 4; ++e)
      for (int64_t i = 0; i < per; ++i) {
        EXPECT_EQ(layer.grads().experts.w1.data<float>()[e * per + i], 0.0f);
        EXPECT_EQ(layer.grads().experts.w2.data<float>()[e * per + i], 0.0f);
      }
  }
}

TEST(MoeLayerEdges, EveryTokenToOneExpert) {
  MoeConfig c = small_config(4, 1);
  SoloComm comm;
  MoeLayer layer(c, {}, comm);
  layer.init_params(41);
  Tensor x = random_x(5, c.model_dim, 41);
  force_routes(layer, x);
  MoeState state;
  Tensor y = layer.forward(x, state);
  EXPECT_EQ(state.routes.expert_offsets, (std::vector<int64_t>{0, 5, 5, 5, 5}));
  DenseResult ref = dense_reference(c, layer.params(), x, state.routes);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_NEAR(y.data<float>()[i], ref.y[static_cast<size_t>(i)], 1e-5);
  layer.zero_grads();
  Tensor gx = layer.backward(random_x(5, c.model_dim, 42), state);
  for (int64_t i = 0; i < gx.numel(); ++i) EXPECT_TRUE(std::isfinite(gx.data<float>()[i]));
  const int64_t per = c.hidden_dim * c.model_dim;
  for (int64_t i = per; i < 4 * per; ++i) EXPECT_EQ(layer.grads().experts.w3.data<float>()[i], 0.0f);
}

TEST(MoeLayerEdges, ZeroTokens) {
  MoeConfig c = small_config();
  c.router.aux_loss_coef = 0.1;
  c.router.z_loss_coef = 0.1;
  MoeExecution e;
  e.capacity = CapacityPolicy::with(CapacityRule::Source, 1.0);
  SoloComm comm;
  MoeLayer layer(c, e, comm);
  layer.init_params(51);
  MoeState state;
  Tensor y = layer.forward(Tensor::empty({0, c.model_dim}), state);
  EXPECT_EQ(y.shape(), (Shape{0, c.model_dim}));
  EXPECT_EQ(state.metrics.aux_loss, 0.0);
  EXPECT_EQ(state.metrics.drop_rate, 0.0);
  EXPECT_EQ(state.metrics.utilisation, 0.0);
  layer.zero_grads();
  Tensor gx = layer.backward(Tensor::empty({0, c.model_dim}), state);
  EXPECT_EQ(gx.shape(), (Shape{0, c.model_dim}));
  for (float v : layer.grads().w_router.span<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : layer.grads().experts.w2.span<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(MoeLayerConfig, BadConfigurationsAreClearErrors) {
  SoloComm comm;
  auto message = [&](const MoeConfig& c, int ep_size = 1, const MoeExecution& e = {}) {
    try {
      if (ep_size == 1) {
        MoeLayer layer(c, e, comm);
      } else {
        c.validate();
        e.validate(c, ep_size);
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(small_config(4, 5)).find("top_k=5"), std::string::npos);
  MoeExecution bad_cf;
  bad_cf.capacity = CapacityPolicy::with(CapacityRule::Rank, 0.0);
  EXPECT_NE(message(small_config(), 1, bad_cf).find("cf=0"), std::string::npos);
  EXPECT_NE(message(small_config(), 3).find("not divisible by EP degree=3"), std::string::npos);
  MoeExecution bad_path;
  bad_path.path = "teleport";
  EXPECT_NE(message(small_config(), 1, bad_path).find("'teleport' is unknown"), std::string::npos);
  EXPECT_EQ(message(small_config()), "");
}

}  // namespace
}  // namespace expar
