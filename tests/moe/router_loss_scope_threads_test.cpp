// The router's loss scope (threads backend), laid out as context parallelism lays out chunks: `batches`
// batches of tokens, each spread over the ranks (rank r holds m_r rows of every batch, some m_r = 0), every
// rank's rows the batches' pieces in order. With the scope, every rank reports the mean over the batches of
// the aux and z losses of one rank routing each whole batch alone; each rank's input gradient equals its
// rows of those whole-batch gradients (coefficients / batches), and the router weight and logit bias
// gradients summed over the group equal their sum, for the softmax, gpt-oss (softmax over the K logits,
// logit bias) and sigmoid (grouped, score-biased) routers with both losses on. The whole-batch gradients
// are the ones router_test.cpp checks by finite differences. Without the scope a rank's own tokens give
// other losses (the reason the scope exists, checked too).
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <numeric>
#include <vector>

#include "common/close.hpp"
#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/router.hpp"

namespace expar {
namespace {

constexpr int kDim = 4;

struct Inputs {
  std::vector<float> x, w, g, score_bias, logit_bias;  // [T, d], [E, d], [T, K], [E], [E]
};

std::vector<float> normal(size_t n, uint64_t seed, uint64_t stream, float stddev) {
  Tensor t = Tensor::empty({static_cast<int64_t>(n)});
  fill_normal(t, seed, stream, stddev);
  return {t.data<float>(), t.data<float>() + n};
}

// Rows `rows` (global indices) of a [T, width] matrix.
std::vector<float> take(const std::vector<float>& v, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<float> out;
  for (int64_t r : rows) out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
  return out;
}

Tensor tensor_of(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// Losses and gradients of one router forward/backward over global rows `rows` (plain values, so nothing
// allocated inside a rank outlives run_ranks).
struct Routed {
  double aux = 0, z = 0;
  std::vector<int32_t> idx;
  std::vector<float> grad_x, grad_w, grad_lb;
};

Routed route(const RouterConfig& c, const Inputs& in, bool score_bias, bool logit_bias,
             const std::vector<int64_t>& rows, const RouterLossScope& scope) {
  const int64_t e = c.num_experts, k = c.top_k, t = static_cast<int64_t>(rows.size());
  const Tensor x = tensor_of(take(in.x, rows, kDim), {t, kDim}), g = tensor_of(take(in.g, rows, k), {t, k});
  const Tensor w = tensor_of(in.w, {e, kDim}), sb = tensor_of(in.score_bias, {e}),
               lb = tensor_of(in.logit_bias, {e});
  RouterState state;
  const RouterOutput out =
      router_forward(c, x, w, score_bias ? &sb : nullptr, state, logit_bias ? &lb : nullptr, scope);
  Tensor grad_x = Tensor::zeros({t, kDim}), grad_w = Tensor::zeros({e, kDim}), grad_lb = Tensor::zeros({e});
  router_backward(c, state, w, g, grad_x, grad_w, logit_bias ? &grad_lb : nullptr);
  Routed r{out.aux_loss, out.z_loss, {}, values(grad_x), values(grad_w), values(grad_lb)};
  r.idx.assign(out.topk_idx.data<int32_t>(), out.topk_idx.data<int32_t>() + out.topk_idx.numel());
  return r;
}

const test::Tolerance kClose = test::Tolerance::abs_plus_rel(1e-6, 1e-5);

void add_into(std::vector<float>& sum, const std::vector<float>& v) {
  sum.resize(v.size(), 0.0f);
  for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
}

// `batches` batches of sum(pieces) tokens; rank r holds pieces[r] rows of each (global row
// b·sum + offset_r + i), its rows batch-major.
void check_scope(RouterConfig c, bool score_bias, bool logit_bias, uint64_t seed, int batches,
                 const std::vector<int64_t>& pieces) {
  const int ranks = static_cast<int>(pieces.size());
  int64_t batch_tokens = 0;
  std::vector<int64_t> offset;
  for (int64_t p : pieces) {
    offset.push_back(batch_tokens);
    batch_tokens += p;
  }
  const int64_t tokens = batches * batch_tokens;
  const auto e = static_cast<size_t>(c.num_experts), k = static_cast<size_t>(c.top_k);
  const Inputs in{normal(static_cast<size_t>(tokens) * kDim, seed, 1, 1.0f), normal(e * kDim, seed, 2, 1.0f),
                  normal(static_cast<size_t>(tokens) * k, seed, 3, 1.0f), normal(e, seed, 4, 0.1f),
                  normal(e, seed, 5, 0.5f)};
  auto rows_of = [&](int r) {
    std::vector<int64_t> rows;
    for (int b = 0; b < batches; ++b)
      for (int64_t i = 0; i < pieces[static_cast<size_t>(r)]; ++i)
        rows.push_back(b * batch_tokens + offset[static_cast<size_t>(r)] + i);
    return rows;
  };
  // The reference: each whole batch routed alone, its loss coefficients divided by the batch count.
  RouterConfig per_batch = c;
  per_batch.aux_loss_coef /= batches;
  per_batch.z_loss_coef /= batches;
  double aux = 0, z = 0;
  std::vector<float> grad_x(static_cast<size_t>(tokens) * kDim), grad_w, grad_lb;
  std::vector<int32_t> idx(static_cast<size_t>(tokens) * k);
  for (int b = 0; b < batches; ++b) {
    std::vector<int64_t> rows(static_cast<size_t>(batch_tokens));
    std::iota(rows.begin(), rows.end(), b * batch_tokens);
    const Routed whole = route(per_batch, in, score_bias, logit_bias, rows, {});
    aux += whole.aux / batches;
    z += whole.z / batches;
    std::copy(whole.grad_x.begin(), whole.grad_x.end(), grad_x.begin() + b * batch_tokens * kDim);
    std::copy(whole.idx.begin(), whole.idx.end(), idx.begin() + b * batch_tokens * static_cast<int64_t>(k));
    add_into(grad_w, whole.grad_w);
    add_into(grad_lb, whole.grad_lb);
  }
  ASSERT_GT(aux, 0.0);
  ASSERT_GT(z, 0.0);

  std::mutex m;
  std::vector<Routed> parts(static_cast<size_t>(ranks)), own(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& world) {
    const int r = world.rank();
    Routed part = route(c, in, score_bias, logit_bias, rows_of(r), {&world, batches});
    world.all_reduce(std::span<float>(part.grad_w));
    world.all_reduce(std::span<float>(part.grad_lb));
    Routed alone = route(c, in, score_bias, logit_bias, rows_of(r), {nullptr, batches});
    std::lock_guard lock(m);
    parts[static_cast<size_t>(r)] = std::move(part);
    own[static_cast<size_t>(r)] = std::move(alone);
  });
  const std::string split = fmt::format("{} batches, pieces {{{}}}", batches, fmt::join(pieces, ","));
  for (int r = 0; r < ranks; ++r) {
    const Routed& p = parts[static_cast<size_t>(r)];
    const std::string what = split + " rank " + std::to_string(r);
    EXPECT_NEAR(p.aux, aux, 1e-12 * aux) << what;
    EXPECT_NEAR(p.z, z, 1e-12 * z) << what;
    const std::vector<int64_t> rows = rows_of(r);
    std::vector<int32_t> want_idx;
    for (int64_t row : rows)
      want_idx.insert(want_idx.end(), idx.begin() + row * k, idx.begin() + (row + 1) * k);
    EXPECT_EQ(p.idx, want_idx) << what;
    EXPECT_TRUE(test::close(p.grad_x, take(grad_x, rows, kDim), kClose)) << what << " grad_x";
    EXPECT_TRUE(test::close(p.grad_w, grad_w, kClose)) << what << " grad_w_router summed";
    if (logit_bias) {
      EXPECT_TRUE(test::close(p.grad_lb, grad_lb, kClose)) << what << " grad_logit_bias summed";
    }
  }
  // A rank's own tokens are other batches: their load-balancing loss is not the whole batches'.
  EXPECT_GT(std::fabs(own[0].aux - aux), 1e-4 * aux) << split;
}

const RouterConfig kSoftmax{
    .num_experts = 6, .top_k = 3, .renormalize = true, .aux_loss_coef = 0.5, .z_loss_coef = 0.1};
const RouterConfig kSoftmaxOverTopk{
    .num_experts = 7, .top_k = 3, .softmax_over_topk = true, .aux_loss_coef = 0.4, .z_loss_coef = 0.1};
const RouterConfig kSigmoidGrouped{.num_experts = 8,
                                   .top_k = 2,
                                   .score = ScoreFunction::Sigmoid,
                                   .renormalize = true,
                                   .n_group = 4,
                                   .topk_group = 2,
                                   .aux_loss_coef = 0.2,
                                   .z_loss_coef = 0.05};

TEST(RouterLossScope, TwoRanksOneBatch) {
  check_scope(kSoftmax, false, false, 21, 1, {5, 6});
  check_scope(kSoftmaxOverTopk, false, true, 22, 1, {6, 5});
  check_scope(kSigmoidGrouped, true, false, 23, 1, {4, 7});
}

TEST(RouterLossScope, ThreeRanksOneOfThemEmpty) {
  check_scope(kSoftmax, false, false, 31, 1, {3, 0, 8});
  check_scope(kSoftmaxOverTopk, false, true, 32, 1, {4, 0, 7});
  check_scope(kSigmoidGrouped, true, false, 33, 1, {7, 0, 4});
}

// Several batches per forward: a CP group's microbatch holding the microbatches of C ranks of C = 1.
TEST(RouterLossScope, SeveralBatchesPerForward) {
  check_scope(kSoftmax, false, false, 41, 2, {3, 3});
  check_scope(kSoftmaxOverTopk, false, true, 42, 3, {2, 4});
  check_scope(kSigmoidGrouped, true, false, 43, 2, {3, 0, 2});
}

}  // namespace
}  // namespace expar
