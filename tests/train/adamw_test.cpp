// AdamW against steps worked out by hand from the published update (Loshchilov & Hutter, "Decoupled Weight
// Decay Regularization", Algorithm 2, with Adam's bias correction): per element, with t the step number,
//   m = b1*m + (1-b1)*g,  v = b2*v + (1-b2)*g^2,  m^ = m/(1-b1^t),  v^ = v/(1-b2^t),
//   w = w - lr*wd*w - lr*m^/(sqrt(v^) + eps)     (the decay term only for parameters with weight_decay)
// The layout tests compare AdamW with itself across layouts; these catch a formula error shared by all.
#include "expar/train/adamw.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "expar/comm/launcher.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/rng.hpp"

namespace expar {
namespace {

constexpr double kLr = 0.1;

AdamWConfig config(double clip_norm) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  c.clip_norm = clip_norm;
  return c;
}

void set(Tensor& t, std::vector<float> values) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = values[i];
}

// Two steps on a decayed parameter a = [1, -2] and an exempt one b = [3] (a norm's gain), no clipping.
//
// Step 1: m = 0.1 g, v = 0.05 g^2 and the corrections divide by 0.1 and 0.05, so m^ = g, v^ = g^2 and the
// update is lr*g/(|g| + eps) = lr*sign(g) to 1e-8: w = w*(1 - lr*wd) - lr*sign(g).
//   g = [0.5, -0.25], [0.5]:  a = [1*0.99 - 0.1, -2*0.99 + 0.1] = [0.89, -1.88];  b = 3 - 0.1 = 2.9.
// Step 2: g = [0.1, 0.5], [0.1]; corrections 1 - 0.9^2 = 0.19 and 1 - 0.95^2 = 0.0975.
//   a[0]: m = 0.9*0.05 + 0.1*0.1 = 0.055, v = 0.95*0.0125 + 0.05*0.01 = 0.012375,
//         m^ = 0.28947368, v^ = 0.12692308, sqrt = 0.35626265, update = 0.1*0.28947368/0.35626265 =
//         0.08125290, a[0] = 0.89*0.99 - 0.08125290 = 0.79984710.
//   a[1]: m = 0.9*-0.025 + 0.1*0.5 = 0.0275, v = 0.95*0.003125 + 0.05*0.25 = 0.01546875,
//         m^ = 0.14473684, v^ = 0.15865385, sqrt = 0.39831376, update = 0.03633740,
//         a[1] = -1.88*0.99 - 0.03633740 = -1.89753740.
//   b:    the same moments as a[0], no decay: 2.9 - 0.08125290 = 2.81874710.
TEST(AdamW, TwoStepsMatchTheHandComputedUpdate) {
  run_ranks(1, [](Comm& world) {
    Parameter a = make_parameter("a", {2}, ParamKind::Dense, true);
    Parameter b = make_parameter("b", {1}, ParamKind::Dense, false);
    set(a.value, {1.0f, -2.0f});
    set(b.value, {3.0f});
    AdamW opt({&a, &b}, config(0.0), world, world);

    set(a.grad, {0.5f, -0.25f});
    set(b.grad, {0.5f});
    EXPECT_NEAR(opt.step(kLr), std::sqrt(0.25 + 0.0625 + 0.25), 1e-7);  // the norm before clipping
    EXPECT_NEAR(a.value.data<float>()[0], 0.89, 1e-6);
    EXPECT_NEAR(a.value.data<float>()[1], -1.88, 1e-6);
    EXPECT_NEAR(b.value.data<float>()[0], 2.9, 1e-6);
    EXPECT_NEAR(opt.state()[0].m.data<float>()[1], -0.025, 1e-7);
    EXPECT_NEAR(opt.state()[0].v.data<float>()[1], 0.003125, 1e-7);

    set(a.grad, {0.1f, 0.5f});
    set(b.grad, {0.1f});
    opt.step(kLr);
    EXPECT_EQ(opt.steps_taken(), 2);
    EXPECT_NEAR(a.value.data<float>()[0], 0.79984710, 1e-6);
    EXPECT_NEAR(a.value.data<float>()[1], -1.89753740, 1e-6);
    EXPECT_NEAR(b.value.data<float>()[0], 2.81874710, 1e-6);
    EXPECT_NEAR(opt.state()[0].m.data<float>()[0], 0.055, 1e-7);
    EXPECT_NEAR(opt.state()[0].v.data<float>()[0], 0.012375, 1e-7);
  });
}

// Clipping by the global norm over dense and expert parameters: g = [3] and [4] have norm 5 > clip 1, so the
// moments see g*1/(5 + 1e-6): m = 0.1*[0.6, 0.8], v = 0.05*[0.36, 0.64] (to 1e-7).
TEST(AdamW, ClipsByTheGlobalNormBeforeTheMoments) {
  run_ranks(1, [](Comm& world) {
    Parameter dense = make_parameter("dense", {1}, ParamKind::Dense, false);
    Parameter expert = make_parameter("expert", {1}, ParamKind::Expert, false);
    AdamW opt({&dense, &expert}, config(1.0), world, world);
    set(dense.grad, {3.0f});
    set(expert.grad, {4.0f});
    EXPECT_NEAR(opt.global_grad_norm(), 5.0, 1e-12);
    EXPECT_NEAR(opt.step(kLr), 5.0, 1e-12);
    EXPECT_NEAR(opt.state()[0].m.data<float>()[0], 0.06, 1e-7);
    EXPECT_NEAR(opt.state()[1].m.data<float>()[0], 0.08, 1e-7);
    EXPECT_NEAR(opt.state()[0].v.data<float>()[0], 0.018, 1e-7);
    EXPECT_NEAR(opt.state()[1].v.data<float>()[0], 0.032, 1e-7);
  });
}

// The global norm is √(dense + expert), each the sum in parameter order of each parameter's Σ g² taken as one
// sequential double chain in element order over the rows it counts (adamw.cpp runs several parameters'
// chains interleaved): its bits against that reference, over parameters of many lengths (groups of equal
// and unequal lengths, a group of fewer than four), one of them counting only some rows.
TEST(AdamW, GlobalNormGivesTheBitsOfOneParameterAfterAnother) {
  run_ranks(1, [](Comm& world) {
    const std::vector<int64_t> sizes{1, 300, 7, 4096, 128, 128, 128, 128, 33, 2048, 5, 1000, 64};
    std::vector<Parameter> params;
    params.reserve(sizes.size() + 1);
    for (size_t k = 0; k < sizes.size(); ++k)
      params.push_back(make_parameter(std::string(1, static_cast<char>('a' + k)), {sizes[k]},
                                      k % 3 == 0 ? ParamKind::Expert : ParamKind::Dense));
    params.push_back(make_parameter("rows", {4, 50}, ParamKind::Expert));
    params.back().norm_rows = {true, false, true, true};
    std::vector<Parameter*> pointers;
    for (Parameter& p : params) {
      fill_normal(p.grad, 71, pointers.size(), 0.3f);
      pointers.push_back(&p);
    }
    AdamW opt(pointers, config(1.0), world, world);
    double dense = 0.0, expert = 0.0;
    for (const Parameter& p : params) {
      const float* g = p.grad.data<float>();
      const int64_t n = p.grad.numel(), per_row = p.norm_rows.empty() ? n : n / p.grad.dim(0);
      double sq = 0.0;
      for (int64_t i = 0; i < n; ++i)
        if (p.norm_rows.empty() || p.norm_rows[static_cast<size_t>(i / per_row)])
          sq += static_cast<double>(g[i]) * g[i];
      (p.kind == ParamKind::Dense ? dense : expert) += sq;
    }
    const double want = std::sqrt(dense + expert), got = opt.global_grad_norm();
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(double)), 0) << got << " against " << want;
  });
}

// Mixed precision: a parameter's BF16 copy (Parameter::bf16_copy) is refreshed in the update's own pass.
// After each step every copy element is f32_to_bf16 of its updated value (the copy starts poisoned with
// 0xFFFF, a NaN no rounding of these values gives), and the values are bit for bit those of the same steps
// without a copy. Sharded over EP_DP (2 members), each member's copy covers the gathered whole tensor.
void expect_copy_refreshed(bool shard) {
  const int members = shard ? 2 : 1;
  run_ranks(members, [&](Comm& world) {
    const int64_t n = 37;  // not a multiple of a vector's lanes, and split unevenly when sharded
    auto make = [&](const char* name) {
      Parameter p = make_parameter(name, {n}, ParamKind::Expert, true);
      for (int64_t j = 0; j < n; ++j) p.value.data<float>()[j] = 0.1f * static_cast<float>(j) - 1.7f;
      return p;
    };
    Parameter with = make("with"), without = make("without");
    with.bf16_copy = Tensor::empty({n}, DType::BF16, MemCategory::Other);
    AdamWConfig c = config(0.0);
    c.shard_expert_state = shard;
    AdamW opt_with({&with}, c, world, world), opt_without({&without}, c, world, world);
    for (int step = 1; step <= 3; ++step) {
      std::fill_n(static_cast<uint16_t*>(with.bf16_copy.raw()), n, uint16_t{0xFFFF});
      for (Parameter* p : {&with, &without})
        for (int64_t j = 0; j < n; ++j)
          p->grad.data<float>()[j] = std::sin(static_cast<float>(j * step)) * static_cast<float>(step);
      opt_with.step(kLr);
      opt_without.step(kLr);
      ASSERT_EQ(std::memcmp(with.value.raw(), without.value.raw(), with.value.nbytes()), 0)
          << "step " << step;
      const auto* copy = static_cast<const uint16_t*>(with.bf16_copy.raw());
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(copy[j], f32_to_bf16(with.value.data<float>()[j]))
            << "step " << step << " element " << j << " rank " << world.rank();
    }
  });
}

TEST(AdamW, RefreshesTheBf16CopyOfEveryUpdatedValue) {
  expect_copy_refreshed(false);
}

TEST(AdamW, RefreshesTheWholeBf16CopyOfAShardedParameter) {
  expect_copy_refreshed(true);
}

}  // namespace
}  // namespace expar
