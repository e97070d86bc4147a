// The products of a linear map in mixed precision (nn/linear_products.hpp), as attention's projections and
// the LM head run them under `expar train --precision bf16`:
//  1. each product (forward, input gradient, weight gradient; plain and accumulating) against the f64
//     reference of its own BF16 operands (the weight's copy, the activations rounded to BF16): |c − exact| ≤
//     γ_t·(Σ|a·b| + |c0|), γ_t = t·u/(1 − t·u), u = 2^-24, t the accumulation length (+1 accumulating), the
//     bound of tests/core/matmul_bf16_test.cpp, not loosened: the BF16 operands' products are exact in f32;
//  2. the gradients of attention (x, wq, wk, wv, wo) and of a linear layer (x, weight, bias) with BF16
//     products against central finite differences of the f32 loss on the f32 masters. Loose, stated: each
//     operand of a product is rounded to 8 significant bits (relative error ≤ 2^-9 each), so the tolerance
//     is nn/test_util's check at rtol 0.1 (per element on the tensor's scale, 2.5 % for the whole vector);
//  3. the copies: refresh_bf16_copy rounds every value as f32_to_bf16 does, in place once made (views see
//     the new values), and refuses a master that is not F32.
// Outputs start poisoned (NaN) where a product writes them, random where it accumulates.
#include "expar/nn/linear_products.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/bf16_bound.hpp"
#include "common/random_tensor.hpp"
#include "core/expect_error.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/linear.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;

bool has_bf16_matmul() {
  return dnnl_isa_name().rfind("avx512_core", 0) == 0;  // oneDNN 2.6 has no BF16 matmul below AVX-512
}

double bf(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

Tensor poisoned(Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::nanf("");
  return t;
}

Tensor bf16_copy(const Tensor& master) {
  Tensor copy;
  refresh_bf16_copy(master, copy, MemCategory::Other);
  return copy;
}

using test::ExactSum;

// got [rows, cols] against exact(i, j) within γ_terms (common/bf16_bound.hpp).
template <typename Exact>
void expect_within_bound(const Tensor& got, int64_t terms, Exact exact, const char* what) {
  test::expect_within_bound(got.data<float>(), got.dim(1), got.dim(0), got.dim(1), terms, exact, what);
}

TEST(LinearProductsBf16, EveryProductMatchesTheF64ReferenceOfItsBf16Operands) {
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const int64_t m = 37, in = 70, out = 29;
  const Tensor x = randn({m, in}, 1), w = randn({out, in}, 2, 0.1f), gy = randn({m, out}, 3);
  const Tensor wb = bf16_copy(w);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating" : "plain");
    const Tensor y0 = randn({m, out}, 4), gx0 = randn({m, in}, 5), gw0 = randn({out, in}, 6);
    Tensor y = accumulate ? y0.clone() : poisoned({m, out});
    const ProductRows xr = product_rows(x.data<float>(), m, in, true),
                      gyr = product_rows(gy.data<float>(), m, out, true);
    linear_product(xr, m, w, wb, y.data<float>(), accumulate);
    expect_within_bound(
        y, in + accumulate,
        [&](int64_t i, int64_t j) {
          ExactSum s;
          if (accumulate) s.add(y0.data<float>()[i * out + j], 1.0);
          for (int64_t p = 0; p < in; ++p)
            s.add(bf(x.data<float>()[i * in + p]), bf(w.data<float>()[j * in + p]));
          return s;
        },
        "y");
    Tensor gx = accumulate ? gx0.clone() : poisoned({m, in});
    linear_input_grad(gyr, m, w, wb, gx.data<float>(), accumulate);
    expect_within_bound(
        gx, out + accumulate,
        [&](int64_t i, int64_t j) {
          ExactSum s;
          if (accumulate) s.add(gx0.data<float>()[i * in + j], 1.0);
          for (int64_t p = 0; p < out; ++p)
            s.add(bf(gy.data<float>()[i * out + p]), bf(w.data<float>()[p * in + j]));
          return s;
        },
        "grad_x");
    // The weight gradient always accumulates (into the f32 gradient).
    Tensor gw = gw0.clone();
    linear_weight_grad(gyr, xr, m, gw);
    expect_within_bound(
        gw, m + 1,
        [&](int64_t i, int64_t j) {
          ExactSum s;
          s.add(gw0.data<float>()[i * in + j], 1.0);
          for (int64_t p = 0; p < m; ++p)
            s.add(bf(gy.data<float>()[p * out + i]), bf(x.data<float>()[p * in + j]));
          return s;
        },
        "grad_w");
  }
}

TEST(LinearProductsBf16, WithoutACopyTheProductsAreTheF32Ones) {
  const int64_t m = 9, in = 12, out = 7;
  const Tensor x = randn({m, in}, 1), w = randn({out, in}, 2), gy = randn({m, out}, 3);
  Tensor y = poisoned({m, out}), want = poisoned({m, out});
  const ProductRows xr = product_rows(x.data<float>(), m, in, false),
                    gyr = product_rows(gy.data<float>(), m, out, false);
  EXPECT_FALSE(xr.bf16.defined());
  linear_product(xr, m, w, Tensor{}, y.data<float>(), false);
  matmul(x.data<float>(), w.data<float>(), want.data<float>(), m, out, in, false, true, false);
  EXPECT_EQ(std::memcmp(y.raw(), want.raw(), y.nbytes()), 0);
  Tensor gw = Tensor::zeros({out, in}), gw_want = Tensor::zeros({out, in});
  linear_weight_grad(gyr, xr, m, gw);
  matmul(gy.data<float>(), x.data<float>(), gw_want.data<float>(), out, in, m, true, false, true);
  EXPECT_EQ(std::memcmp(gw.raw(), gw_want.raw(), gw.nbytes()), 0);
}

TEST(LinearProductsBf16, LinearLayerGradientsMatchFiniteDifferencesOfTheF32Master) {
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const int64_t n = 11, in = 24, out = 17;
  Tensor x = randn({n, in}, 1), w = randn({out, in}, 2, 0.3f), bias = randn({out}, 3), r = randn({n, out}, 4);
  const Tensor wb = bf16_copy(w);
  LinearSaved saved;
  linear_forward(x, w, &bias, &saved, wb);
  Tensor gw = Tensor::zeros({out, in}), gb = Tensor::zeros({out});
  const Tensor gx = linear_backward(saved, r, w, gw, &gb, wb);
  // The f32 loss of the f32 masters (perturbed in place; the copy is not refreshed: it is the f32 slope).
  auto loss = [&] { return testing::project(r, linear_forward(x, w, &bias, nullptr)); };
  testing::expect_gradient("linear grad_x", loss, x, gx, 1e-2, 0.1);
  testing::expect_gradient("linear grad_w", loss, w, gw, 1e-2, 0.1);
  testing::expect_gradient("linear grad_bias", loss, bias, gb, 1e-2, 0.1);
}

TEST(LinearProductsBf16, AttentionGradientsMatchFiniteDifferencesOfTheF32Master) {
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const AttentionShape s{4, 2, 8};
  const int64_t batch = 2, seq = 6, d = 16;
  Rope rope(s.head_dim, seq);
  const float std_in = 1.0f / std::sqrt(float(d)), std_out = 1.0f / std::sqrt(float(s.n_heads * s.head_dim));
  // The ordinary initialisation's scale: a sharper softmax (attention_test's 3× queries) amplifies the
  // BF16 roundings of the logits (there the BF16 gradients were 2-3 % off the f32 ones, here 0.4 %).
  AttentionWeights w{
      randn({s.n_heads * s.head_dim, d}, 11, std_in), randn({s.n_kv_heads * s.head_dim, d}, 12, std_in),
      randn({s.n_kv_heads * s.head_dim, d}, 13, std_in), randn({d, s.n_heads * s.head_dim}, 14, std_out)};
  AttentionWeights wb = w;
  wb.wq_bf16 = bf16_copy(w.wq);
  wb.wk_bf16 = bf16_copy(w.wk);
  wb.wv_bf16 = bf16_copy(w.wv);
  wb.wo_bf16 = bf16_copy(w.wo);
  Tensor x = randn({batch * seq, d}, 1), r = randn({batch * seq, d}, 2);
  AttentionSaved saved;
  const Tensor y = attention_forward(s, rope, wb, x, batch, seq, &saved);
  AttentionGrads g{Tensor::zeros(w.wq.shape()), Tensor::zeros(w.wk.shape()), Tensor::zeros(w.wv.shape()),
                   Tensor::zeros(w.wo.shape())};
  const Tensor gx = attention_backward(s, rope, wb, saved, r, g);
  // The BF16 forward is the f32 one within a few BF16 roundings (relative, Frobenius norm).
  const Tensor y32 = attention_forward(s, rope, w, x, batch, seq, nullptr);
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    diff += std::pow(double(y.data<float>()[i]) - y32.data<float>()[i], 2);
    norm += std::pow(double(y32.data<float>()[i]), 2);
  }
  EXPECT_GT(diff, 0.0) << "the BF16 products must differ from f32 somewhere";
  EXPECT_LE(std::sqrt(diff / norm), std::ldexp(1.0, -6));
  auto loss = [&] { return testing::project(r, attention_forward(s, rope, w, x, batch, seq, nullptr)); };
  testing::expect_gradient("attention grad_x", loss, x, gx, 1e-2, 0.1);
  testing::expect_gradient("attention grad_wq", loss, w.wq, g.wq, 1e-2, 0.1);
  testing::expect_gradient("attention grad_wk", loss, w.wk, g.wk, 1e-2, 0.1);
  testing::expect_gradient("attention grad_wv", loss, w.wv, g.wv, 1e-2, 0.1);
  testing::expect_gradient("attention grad_wo", loss, w.wo, g.wo, 1e-2, 0.1);
}

// Under BF16 products a forward saves the activations only the BF16 weight-gradient products read again as
// those products' BF16 rounding (nn/linear_products.hpp's saved_operand); under f32 products, the caller's
// tensor itself.
TEST(LinearProductsBf16, SavedInputsAreTheirBf16Rounding) {
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const int64_t n = 6, in = 10, out = 5;
  const Tensor x = randn({n, in}, 1), w = randn({out, in}, 2);
  LinearSaved saved, saved32;
  linear_forward(x, w, nullptr, &saved, bf16_copy(w));
  linear_forward(x, w, nullptr, &saved32);
  EXPECT_EQ(saved32.x.raw(), x.raw()) << "f32 products keep the input itself";
  ASSERT_EQ(saved.x.dtype(), DType::BF16);
  ASSERT_EQ(saved.x.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(static_cast<const uint16_t*>(saved.x.raw())[i], f32_to_bf16(x.data<float>()[i])) << i;

  const AttentionShape s{2, 1, 4};
  const int64_t batch = 1, seq = 3, d = 8;
  Rope rope(s.head_dim, seq);
  AttentionWeights aw{randn({s.n_heads * s.head_dim, d}, 11), randn({s.n_kv_heads * s.head_dim, d}, 12),
                      randn({s.n_kv_heads * s.head_dim, d}, 13), randn({d, s.n_heads * s.head_dim}, 14)};
  aw.wq_bf16 = bf16_copy(aw.wq);
  aw.wk_bf16 = bf16_copy(aw.wk);
  aw.wv_bf16 = bf16_copy(aw.wv);
  aw.wo_bf16 = bf16_copy(aw.wo);
  const Tensor ax = randn({batch * seq, d}, 3);
  AttentionSaved as;
  attention_forward(s, rope, aw, ax, batch, seq, &as);
  ASSERT_EQ(as.x.dtype(), DType::BF16);
  for (int64_t i = 0; i < ax.numel(); ++i)
    ASSERT_EQ(static_cast<const uint16_t*>(as.x.raw())[i], f32_to_bf16(ax.data<float>()[i])) << i;
  EXPECT_EQ(as.context.dtype(), DType::BF16);
  EXPECT_EQ(as.context.shape(), Shape({batch * seq, s.n_heads * s.head_dim}));
  // What an f32 operation reads in the backward stays f32.
  for (const Tensor* t : {&as.q, &as.k, &as.v, &as.probs}) EXPECT_EQ(t->dtype(), DType::F32);
}

TEST(LinearProductsBf16, CopiesRoundEveryValueAndRefreshInPlace) {
  Tensor master = randn({5, 9}, 1);
  master.data<float>()[3] = std::nanf("");
  Tensor copy;
  refresh_bf16_copy(master, copy, MemCategory::Other);
  ASSERT_EQ(copy.dtype(), DType::BF16);
  ASSERT_EQ(copy.shape(), master.shape());
  const void* storage = copy.raw();
  const Tensor view = copy;  // a handle on the same storage
  master.data<float>()[7] = 2.5f;
  master.data<float>()[8] = -1e-3f;
  refresh_bf16_copy(master, copy, MemCategory::Other);
  EXPECT_EQ(copy.raw(), storage) << "refreshed in place";
  for (int64_t i = 0; i < master.numel(); ++i)
    ASSERT_EQ(static_cast<const uint16_t*>(view.raw())[i], f32_to_bf16(master.data<float>()[i])) << i;
  const Tensor narrow = to_bf16(master, MemCategory::Other);
  Tensor other;
  expar::testing::expect_error([&] { refresh_bf16_copy(narrow, other, MemCategory::Other); },
                               {"BF16 copies are made from F32 weights"});
}

}  // namespace
}  // namespace expar::nn
