// The grouped experts with BF16 products (moe/expert_mlp.hpp: ExpertWeights' BF16 copies, matmul_bf16):
//  1. each product against the f64 reference of its own BF16 operands, within the f32 summation bound of
//     tests/core/matmul_bf16_test.cpp: |c − exact| ≤ γ_t·Σ|a·b| (+ |c0| when accumulating), γ_t = t·u/(1 −
//     t·u), u = 2^-24, t the accumulation length (d, h, or an expert's rows; +1 accumulating), and the saved
//     pre-activations the BF16 roundings of the f32 gate and up products (biases added). To know each
//     product's operands exactly, the inputs, weights, biases and output gradient are small dyadic values
//     (k/8 or k/16, |k| ≤ 4), so the products of such operands (x·w1ᵀ, x·w3ᵀ, gy·w2) are exact sums, and the
//     activation is gpt-oss's clamped SwiGLU, whose public scalar functions give the library's bits; the
//     rest (m·w2ᵀ, gyᵀ·m, gaᵀ·x, gbᵀ·x, ga·w1 + gb·w3) multiply those BF16-rounded activations, so their
//     bounds are the real test;
//  2. the whole forward and backward in BF16 against the f32 one (random N(0, 1) inputs, N(0, 0.1²)
//     weights): relative error in the Frobenius norm ≤ 2^-6 for the output and every gradient (BF16 has 8
//     significant bits, a rounding is ≤ 2^-9 relative; measured errors are listed at the test);
//  3. every weight, bias and input gradient of the BF16 backward (SwiGLU and gpt-oss experts) against central
//     finite differences of the f32 loss Σ y·proj on the f32 master weights: |g − fd| ≤ 0.03·max|fd| (of
//     that tensor) + 0.03·|fd| (the BF16 backward differentiates the forward at its BF16-rounded operands and
//     pre-activations; the roundings' own steps are not differentiated, as under autocast);
//  4. the copies: refresh_bf16_copies rounds each master value (f32_to_bf16), in place once made, and the
//     capacity tail is neither read nor written; an expert of one row (m = 1) and an expert without rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/bf16_bound.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expert_fixtures.hpp"

namespace expar {
namespace {

constexpr int64_t kD = 48, kH = 40, kLocal = 4;
// One row (m = 1), none, 5 rows, 20 rows; then the tail.
const std::vector<int64_t> kOffsets{0, 1, 1, 6, 26};
const int64_t kRows = kOffsets.back(), kCapacity = kRows + 3;

bool skip() {
  return dnnl_isa_name().rfind("avx512_core", 0) != 0;  // oneDNN has no BF16 matmul below AVX-512
}

float bf(float v) {
  return bf16_to_f32(f32_to_bf16(v));
}

Tensor poisoned(Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_nan(t.raw(), t.nbytes());
  return t;
}

// Values k·scale, k an integer in [-4, 4] (rounded 2·N(0, 1)).
void fill_dyadic(Tensor& t, uint64_t stream, float scale, int64_t count = -1) {
  float* p = t.data<float>();
  const int64_t n = count < 0 ? t.numel() : count;
  for (int64_t i = 0; i < n; ++i) {
    const float k =
        std::clamp(std::nearbyint(2.0f * random_normal(3, stream, static_cast<uint64_t>(i))), -4.0f, 4.0f);
    p[i] = k * scale;
  }
}

int expert_of_row(int64_t row) {
  for (int l = 0; l < kLocal; ++l)
    if (row >= kOffsets[static_cast<size_t>(l)] && row < kOffsets[static_cast<size_t>(l) + 1]) return l;
  return -1;
}

using test::ExactSum;
using test::expect_within_bound;

TEST(ExpertMlpBf16, EveryProductMatchesTheF64ReferenceOfItsBf16Operands) {
  if (skip()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  ExpertWeights w = testing::random_experts(kLocal, kD, kH, /*gpt_oss=*/true, 3);
  fill_dyadic(w.w1, 1, 1.0f / 16);
  fill_dyadic(w.w3, 2, 1.0f / 16);
  fill_dyadic(w.w2, 3, 1.0f / 16);
  fill_dyadic(w.b1, 4, 1.0f / 8);
  fill_dyadic(w.b3, 5, 1.0f / 8);
  fill_dyadic(w.b2, 6, 1.0f / 8);
  refresh_bf16_copies(w);
  Tensor x = poisoned({kCapacity, kD});
  fill_dyadic(x, 7, 1.0f / 8, kRows * kD);
  Tensor y = poisoned({kCapacity, kD});
  ExpertMlpState state;
  expert_mlp_forward(x, PayloadFormat::F32, kOffsets, w, y, &state);
  const int64_t ldp = state.gate_pre.dim(1);
  ASSERT_EQ(state.gate_pre.dtype(), DType::BF16);
  ASSERT_EQ(state.up_pre.dtype(), DType::BF16);
  // The saved pre-activations, BF16 values widened to f32.
  auto saved = [&](const Tensor& pre, int64_t r, int64_t j) {
    return bf16_to_f32(static_cast<const uint16_t*>(pre.raw())[r * ldp + j]);
  };
  const float* X = x.data<float>();
  auto W = [&](const Tensor& t, int64_t l, int64_t i, int64_t j) {  // expert l's matrix element (i, j)
    return double(t.data<float>()[(l * t.dim(1) + i) * t.dim(2) + j]);
  };
  // Forward: a = x·w1ᵀ + b1 and b = x·w3ᵀ + b3 (exact in f32: dyadic operands) saved as their BF16 roundings,
  // then y = bf16(m)·w2ᵀ + b2 with m the clamped SwiGLU of those roundings.
  std::vector<float> mb(static_cast<size_t>(kRows * kH));
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t l = expert_of_row(r);
    for (int64_t j = 0; j < kH; ++j) {
      ExactSum a, b;
      for (int64_t p = 0; p < kD; ++p) {
        a.add(X[r * kD + p], W(w.w1, l, j, p));
        b.add(X[r * kD + p], W(w.w3, l, j, p));
      }
      const float ga = bf(float(a.value + w.b1.data<float>()[l * kH + j]));
      const float gu = bf(float(b.value + w.b3.data<float>()[l * kH + j]));
      EXPECT_EQ(saved(state.gate_pre, r, j), ga);
      EXPECT_EQ(saved(state.up_pre, r, j), gu);
      mb[static_cast<size_t>(r * kH + j)] = bf(gpt_oss_swiglu(ga, gu));
    }
  }
  // y = (m·w2ᵀ, rounded once to f32) + b2: the bound on the product, plus half an ulp for the bias' add.
  std::vector<float> y_minus_bias(static_cast<size_t>(kRows * kD));
  expect_within_bound(
      y.data<float>(), kD, kRows, kD, kH + 1,
      [&](int64_t r, int64_t c) {
        const int64_t l = expert_of_row(r);
        ExactSum s;
        for (int64_t j = 0; j < kH; ++j) s.add(mb[static_cast<size_t>(r * kH + j)], W(w.w2, l, c, j));
        const double bias = w.b2.data<float>()[l * kD + c];
        s.add(bias, 1.0);
        return s;
      },
      "y");
  for (int64_t i = kRows * kD; i < kCapacity * kD; ++i) ASSERT_TRUE(std::isnan(y.data<float>()[i]));

  // Backward, the weight gradients accumulating onto dyadic starting values.
  Tensor gy = poisoned({kCapacity, kD});
  fill_dyadic(gy, 8, 1.0f / 8, kRows * kD);
  ExpertWeights g = testing::zeros_like(w);
  fill_dyadic(g.w1, 9, 1.0f / 4);
  fill_dyadic(g.w3, 10, 1.0f / 4);
  fill_dyadic(g.w2, 11, 1.0f / 4);
  const ExpertWeights g0{g.w1.clone(), g.w3.clone(), g.w2.clone()};
  Tensor gx = poisoned({kCapacity, kD});
  expert_mlp_backward(gy, state, w, gx, g, GradientUpdate::Add);
  const float* GY = gy.data<float>();
  // gm = gy·w2 (exact), then ga, gb by the clamped SwiGLU's gradient, rounded to BF16.
  std::vector<float> ga(static_cast<size_t>(kRows * kH)), gb(ga.size());
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t l = expert_of_row(r);
    for (int64_t j = 0; j < kH; ++j) {
      ExactSum gm;
      for (int64_t c = 0; c < kD; ++c) gm.add(GY[r * kD + c], W(w.w2, l, c, j));
      const GptOssSwigluGrad d = gpt_oss_swiglu_grad(saved(state.gate_pre, r, j), saved(state.up_pre, r, j));
      ga[static_cast<size_t>(r * kH + j)] = bf(float(gm.value) * d.d_gate);
      gb[static_cast<size_t>(r * kH + j)] = bf(float(gm.value) * d.d_up);
    }
  }
  for (int l = 0; l < kLocal; ++l) {
    const int64_t begin = kOffsets[static_cast<size_t>(l)], n = kOffsets[static_cast<size_t>(l) + 1] - begin;
    SCOPED_TRACE(::testing::Message() << "expert " << l << " (" << n << " rows)");
    // grad_w2 [d, h] += gyᵀ·bf16(m); grad_w1 [h, d] += bf16(ga)ᵀ·x; grad_w3 likewise with gb.
    auto weight_grad = [&](const Tensor& grad, const Tensor& start, int64_t rows, int64_t cols, auto left,
                           auto right, const char* what) {
      const float* s0 = start.data<float>() + l * rows * cols;
      expect_within_bound(
          grad.data<float>() + l * rows * cols, cols, rows, cols, n + 1,
          [&](int64_t i, int64_t j) {
            ExactSum s{double(s0[i * cols + j]), std::fabs(double(s0[i * cols + j]))};
            for (int64_t r = begin; r < begin + n; ++r) s.add(left(r, i), right(r, j));
            return s;
          },
          what);
    };
    weight_grad(
        g.w2, g0.w2, kD, kH, [&](int64_t r, int64_t c) { return double(GY[r * kD + c]); },
        [&](int64_t r, int64_t j) { return double(mb[static_cast<size_t>(r * kH + j)]); }, "grad_w2");
    weight_grad(
        g.w1, g0.w1, kH, kD,
        [&](int64_t r, int64_t j) { return double(ga[static_cast<size_t>(r * kH + j)]); },
        [&](int64_t r, int64_t p) { return double(X[r * kD + p]); }, "grad_w1");
    weight_grad(
        g.w3, g0.w3, kH, kD,
        [&](int64_t r, int64_t j) { return double(gb[static_cast<size_t>(r * kH + j)]); },
        [&](int64_t r, int64_t p) { return double(X[r * kD + p]); }, "grad_w3");
  }
  // grad_x = bf16(ga)·w1 + bf16(gb)·w3: two products, the second accumulating onto the first (2h terms).
  expect_within_bound(
      gx.data<float>(), kD, kRows, kD, 2 * kH,
      [&](int64_t r, int64_t p) {
        const int64_t l = expert_of_row(r);
        ExactSum s;
        for (int64_t j = 0; j < kH; ++j) {
          s.add(ga[static_cast<size_t>(r * kH + j)], W(w.w1, l, j, p));
          s.add(gb[static_cast<size_t>(r * kH + j)], W(w.w3, l, j, p));
        }
        return s;
      },
      "grad_x");
  for (int64_t i = kRows * kD; i < kCapacity * kD; ++i) ASSERT_TRUE(std::isnan(gx.data<float>()[i]));
  // The expert without rows: its gradients untouched.
  EXPECT_EQ(std::memcmp(g.w1.data<float>() + kH * kD, g0.w1.data<float>() + kH * kD, kH * kD * 4), 0);
}

double relative_error(const Tensor& got, const Tensor& want, int64_t count) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double d = double(got.data<float>()[i]) - want.data<float>()[i];
    diff += d * d;
    norm += double(want.data<float>()[i]) * want.data<float>()[i];
  }
  return std::sqrt(diff / norm);
}

struct Pass {
  Tensor y, gx;
  ExpertWeights grads;
};

Pass run(const ExpertWeights& w, const Tensor& x, const Tensor& gy) {
  Pass p{poisoned({kCapacity, kD}), poisoned({kCapacity, kD}), testing::zeros_like(w)};
  ExpertMlpState state;
  expert_mlp_forward(x, PayloadFormat::F32, kOffsets, w, p.y, &state);
  expert_mlp_backward(gy, state, w, p.gx, p.grads, GradientUpdate::IntoZeros);
  return p;
}

TEST(ExpertMlpBf16, ForwardAndBackwardCloseToF32) {
  if (skip()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  for (const bool gpt_oss : {false, true}) {
    SCOPED_TRACE(gpt_oss ? "gpt-oss experts" : "SwiGLU experts");
    const ExpertWeights w = testing::random_experts(kLocal, kD, kH, gpt_oss, 21);
    ExpertWeights wb = w;
    refresh_bf16_copies(wb);
    Tensor x = poisoned({kCapacity, kD}), gy = poisoned({kCapacity, kD});
    Tensor live = x.rows(0, kRows), live_gy = gy.rows(0, kRows);
    fill_normal(live, 22, 1, 1.0f);
    fill_normal(live_gy, 22, 2, 1.0f);
    const Pass f = run(w, x, gy), b = run(wb, x, gy);
    const double bound = std::ldexp(1.0, -6);
    EXPECT_LE(relative_error(b.y, f.y, kRows * kD), bound) << "y";
    EXPECT_LE(relative_error(b.gx, f.gx, kRows * kD), bound) << "grad_x";
    EXPECT_LE(relative_error(b.grads.w1, f.grads.w1, w.w1.numel()), bound) << "grad_w1";
    EXPECT_LE(relative_error(b.grads.w3, f.grads.w3, w.w3.numel()), bound) << "grad_w3";
    EXPECT_LE(relative_error(b.grads.w2, f.grads.w2, w.w2.numel()), bound) << "grad_w2";
    if (gpt_oss) {
      EXPECT_LE(relative_error(b.grads.b1, f.grads.b1, w.b1.numel()), bound) << "grad_b1";
      EXPECT_LE(relative_error(b.grads.b3, f.grads.b3, w.b3.numel()), bound) << "grad_b3";
      EXPECT_LE(relative_error(b.grads.b2, f.grads.b2, w.b2.numel()), bound) << "grad_b2";
    }
    std::printf("%s: relative errors y %.2e, grad_x %.2e, grad_w1 %.2e, grad_w3 %.2e, grad_w2 %.2e\n",
                gpt_oss ? "gpt-oss" : "SwiGLU", relative_error(b.y, f.y, kRows * kD),
                relative_error(b.gx, f.gx, kRows * kD), relative_error(b.grads.w1, f.grads.w1, w.w1.numel()),
                relative_error(b.grads.w3, f.grads.w3, w.w3.numel()),
                relative_error(b.grads.w2, f.grads.w2, w.w2.numel()));
  }
}

// An encoded input (a BF16 or MXFP8 dispatch payload, kept encoded as the saved Wgrad input) is read as
// the BF16 rows of its decode: the forward and backward give the bits of the same experts run on the f32
// decode of that payload (decode_payload), which the products round to BF16 themselves.
TEST(ExpertMlpBf16, EncodedInputGivesTheBitsOfItsF32Decode) {
  if (skip()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  // MXFP8 rows need d a multiple of 32.
  for (const auto& [format, d] :
       {std::pair{PayloadFormat::BF16, kD}, std::pair{PayloadFormat::MXFP8, int64_t{64}}}) {
    SCOPED_TRACE(std::string(payload_format_name(format)));
    ExpertWeights w = testing::random_experts(kLocal, d, kH, false, 23);
    refresh_bf16_copies(w);
    Tensor x = poisoned({kCapacity, d}), gy = poisoned({kCapacity, d});
    Tensor live = x.rows(0, kRows), live_gy = gy.rows(0, kRows);
    fill_normal(live, 24, 1, 1.0f);
    fill_normal(live_gy, 24, 2, 1.0f);
    Tensor payload = payload_tensor(format, kCapacity, d);
    fill_nan(payload.raw(), payload.nbytes());
    encode_payload_rows(format, x.data<float>(), kRows, d, static_cast<std::byte*>(payload.raw()));
    const Tensor decoded = decode_payload(payload, format, kRows, d);
    struct Result {
      Tensor y, gx;
      ExpertWeights grads;
    };
    auto run_on = [&](const Tensor& input, PayloadFormat input_format) {
      Result r{poisoned({kCapacity, d}), poisoned({kCapacity, d}), testing::zeros_like(w)};
      ExpertMlpState state;
      expert_mlp_forward(input, input_format, kOffsets, w, r.y, &state);
      expert_mlp_backward(gy, state, w, r.gx, r.grads, GradientUpdate::IntoZeros);
      return r;
    };
    const Result want = run_on(decoded, PayloadFormat::F32), got = run_on(payload, format);
    auto same_bits = [](const Tensor& a, const Tensor& b, int64_t count, const char* what) {
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(count) * sizeof(float)), 0) << what;
    };
    same_bits(got.y, want.y, kRows * d, "y");
    same_bits(got.gx, want.gx, kRows * d, "grad_x");
    same_bits(got.grads.w1, want.grads.w1, w.w1.numel(), "grad_w1");
    same_bits(got.grads.w3, want.grads.w3, w.w3.numel(), "grad_w3");
    same_bits(got.grads.w2, want.grads.w2, w.w2.numel(), "grad_w2");
  }
}

TEST(ExpertMlpBf16, GradientsMatchFiniteDifferencesOfTheF32Master) {
  if (skip()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  for (const bool gpt_oss : {false, true}) {
    SCOPED_TRACE(gpt_oss ? "gpt-oss experts (biases)" : "SwiGLU experts");
    ExpertWeights w = testing::random_experts(kLocal, kD, kH, gpt_oss, 31);
    Tensor x = poisoned({kCapacity, kD}), proj = poisoned({kCapacity, kD});
    Tensor live = x.rows(0, kRows), live_proj = proj.rows(0, kRows);
    fill_normal(live, 32, 1, 1.0f);
    fill_normal(live_proj, 32, 2, 1.0f);
    ExpertWeights wb = w;
    refresh_bf16_copies(wb);
    const Pass b = run(wb, x, proj);
    // The f32 loss of the f32 masters (the tensors w shares with wb, perturbed in place).
    auto loss = [&] {
      Tensor y = poisoned({kCapacity, kD});
      expert_mlp_forward(x, PayloadFormat::F32, kOffsets, w, y, nullptr);
      double l = 0.0;
      for (int64_t i = 0; i < kRows * kD; ++i) l += double(y.data<float>()[i]) * proj.data<float>()[i];
      return l;
    };
    auto check = [&](Tensor& param, const Tensor& grad, int64_t count, const char* name) {
      std::vector<double> fd(static_cast<size_t>(count));
      double largest = 0.0;
      for (int64_t i = 0; i < count; ++i) {
        float& v = param.data<float>()[i];
        const float keep = v, eps = 1e-2f;
        v = keep + eps;
        const double up = loss();
        v = keep - eps;
        const double down = loss();
        v = keep;
        fd[static_cast<size_t>(i)] = (up - down) / (2.0 * eps);
        largest = std::max(largest, std::fabs(fd[static_cast<size_t>(i)]));
      }
      ASSERT_GT(largest, 0.0) << name;
      int bad = 0;
      for (int64_t i = 0; i < count; ++i) {
        const double f = fd[static_cast<size_t>(i)], g = grad.data<float>()[i];
        if (!(std::fabs(g - f) <= 0.03 * largest + 0.03 * std::fabs(f)) && ++bad <= 5)
          ADD_FAILURE() << name << "[" << i << "]: BF16 gradient " << g << ", finite difference " << f;
      }
    };
    check(w.w1, b.grads.w1, w.w1.numel(), "w1");
    check(w.w3, b.grads.w3, w.w3.numel(), "w3");
    check(w.w2, b.grads.w2, w.w2.numel(), "w2");
    if (gpt_oss) {
      check(w.b1, b.grads.b1, w.b1.numel(), "b1");
      check(w.b3, b.grads.b3, w.b3.numel(), "b3");
      check(w.b2, b.grads.b2, w.b2.numel(), "b2");
    }
    check(x, b.gx, kRows * kD, "x");
  }
}

// The saved pre-activations are BF16 under BF16 products and f32 without: a backward whose weights disagree
// with the forward's about the copies is refused, naming both.
TEST(ExpertMlpBf16, ABackwardOfTheOtherPrecisionIsRefused) {
  if (skip()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const ExpertWeights w = testing::random_experts(kLocal, kD, kH, false, 51);
  ExpertWeights wb = w;
  refresh_bf16_copies(wb);
  Tensor x = poisoned({kCapacity, kD}), gy = poisoned({kCapacity, kD});
  Tensor live = x.rows(0, kRows), live_gy = gy.rows(0, kRows);
  fill_normal(live, 52, 1, 1.0f);
  fill_normal(live_gy, 52, 2, 1.0f);
  for (const bool forward_bf16 : {true, false}) {
    Tensor y = poisoned({kCapacity, kD}), gx = poisoned({kCapacity, kD});
    ExpertMlpState state;
    expert_mlp_forward(x, PayloadFormat::F32, kOffsets, forward_bf16 ? wb : w, y, &state);
    ExpertWeights grads = testing::zeros_like(w);
    try {
      expert_mlp_backward(gy, state, forward_bf16 ? w : wb, gx, grads);
      ADD_FAILURE() << "a backward of the other precision ran";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(forward_bf16 ? "pre-activations are BF16" : "pre-activations are F32"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("run the forward and the backward with the same weights"), std::string::npos)
          << what;
    }
  }
}

TEST(ExpertMlpBf16, CopiesRoundTheMastersAndRefreshInPlace) {
  ExpertWeights w = testing::random_experts(2, 8, 6, false, 41);
  EXPECT_FALSE(w.bf16_products());
  refresh_bf16_copies(w);
  ASSERT_TRUE(w.bf16_products());
  EXPECT_EQ(w.w1_bf16.dtype(), DType::BF16);
  EXPECT_EQ(w.w2_bf16.shape(), w.w2.shape());
  EXPECT_EQ(w.bytes(), 3 * 2 * 8 * 6 * (4 + 2));
  const ExpertWeights view = w.experts(1, 2);  // expert 1's copies, the same storage
  auto check = [](const Tensor& master, const Tensor& copy) {
    const uint16_t* c = static_cast<const uint16_t*>(copy.raw());
    for (int64_t i = 0; i < master.numel(); ++i) ASSERT_EQ(c[i], f32_to_bf16(master.data<float>()[i])) << i;
  };
  w.w1.data<float>()[8 * 6 + 3] = 1.2345f;
  w.w2.data<float>()[8 * 6] = -7.0f;
  const void* storage = w.w1_bf16.raw();
  refresh_bf16_copies(w);
  EXPECT_EQ(w.w1_bf16.raw(), storage);
  check(w.w1, w.w1_bf16);
  check(w.w3, w.w3_bf16);
  check(w.w2, w.w2_bf16);
  EXPECT_EQ(static_cast<const uint16_t*>(view.w1_bf16.raw())[3], f32_to_bf16(1.2345f));
  // Copies that do not match the masters are refused by name.
  ExpertWeights bad = w;
  bad.w2_bf16 = w.w1_bf16;
  EXPECT_THROW(bad.validate(), Error);
}

}  // namespace
}  // namespace expar
