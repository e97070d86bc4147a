// Grouped SwiGLU experts (and gpt-oss's clamped, biased ones), in the row and the column form and decode's
// one-row form: forward against a per-row f64 computation, every gradient (biases included) by central finite
// differences, and the capacity tail (and experts without rows) left unread and unwritten.
#include "expar/moe/expert_mlp.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"
#include "expert_fixtures.hpp"

namespace expar {
namespace {

// Local expert 0 has 2 rows (the row form), expert 1 none, expert 2 one more than the column form's threshold
// (expert_mlp.hpp); the rows past the last offset are the tail.
constexpr int64_t kD = 4, kH = 5, kLocal = 3;
const std::vector<int64_t> kOffsets{0, 2, 2, 3 + kExpertColumnFormMinRows};
const int64_t kCapacity = kOffsets.back() + 3;

ExpertWeights random_weights(uint64_t seed) {
  ExpertWeights w{Tensor::empty({kLocal, kH, kD}), Tensor::empty({kLocal, kH, kD}),
                  Tensor::empty({kLocal, kD, kH})};
  fill_normal(w.w1, seed, 1, 0.6f);
  fill_normal(w.w3, seed, 2, 0.6f);
  fill_normal(w.w2, seed, 3, 0.6f);
  return w;
}

Tensor poisoned(Shape shape) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_nan(t.raw(), t.nbytes());
  return t;
}

Tensor random_input(uint64_t seed) {
  Tensor x = poisoned({kCapacity, kD});
  Tensor live = x.rows(0, kOffsets.back());
  fill_normal(live, seed, 9, 1.0f);
  return x;
}

int expert_of_row(int64_t row) {
  for (int l = 0; l < kLocal; ++l)
    if (row >= kOffsets[static_cast<size_t>(l)] && row < kOffsets[static_cast<size_t>(l) + 1]) return l;
  return -1;
}

// The forward keeping a state for the backward (training) and keeping none (inference: the column form then
// skips the pre-activations' transposes, the row form computes them into scratch): the same bits, the
// poisoned tail included. `state` (optional) receives the state the first kept.
Tensor forward_with_and_without_state(const ExpertWeights& w, const Tensor& x,
                                      const std::vector<int64_t>& offsets = kOffsets,
                                      ExpertMlpState* state = nullptr) {
  Tensor y = poisoned({x.dim(0), x.dim(1)});
  ExpertMlpState kept;
  expert_mlp_forward(x, PayloadFormat::F32, offsets, w, y, state ? state : &kept);
  Tensor unsaved = poisoned({x.dim(0), x.dim(1)});
  expert_mlp_forward(x, PayloadFormat::F32, offsets, w, unsaved, nullptr);
  EXPECT_EQ(std::memcmp(y.raw(), unsaved.raw(), y.nbytes()), 0) << "the forward without a state differs";
  return y;
}

TEST(ExpertMlp, ForwardMatchesPerRowReferenceAndLeavesTheTailAlone) {
  ExpertWeights w = random_weights(3);
  Tensor x = random_input(3);
  Tensor y = forward_with_and_without_state(w, x);
  for (int64_t r = 0; r < kCapacity; ++r) {
    const int l = expert_of_row(r);
    for (int64_t i = 0; i < kD; ++i) {
      const float got = y.data<float>()[r * kD + i];
      if (l < 0) {
        EXPECT_TRUE(std::isnan(got)) << "tail row " << r << " was written";
        continue;
      }
      double want = 0.0;
      for (int64_t j = 0; j < kH; ++j) {
        double a = 0.0, b = 0.0;
        for (int64_t c = 0; c < kD; ++c) {
          a += double(w.w1.data<float>()[(l * kH + j) * kD + c]) * x.data<float>()[r * kD + c];
          b += double(w.w3.data<float>()[(l * kH + j) * kD + c]) * x.data<float>()[r * kD + c];
        }
        want += double(w.w2.data<float>()[(l * kD + i) * kH + j]) * a / (1.0 + std::exp(-a)) * b;
      }
      EXPECT_NEAR(got, want, 1e-5 + 1e-5 * std::fabs(want)) << "row " << r << " col " << i;
    }
  }
}

// From 64 rows the column form runs on a whole number of 16 columns, the rows followed by zero columns
// (expert_mlp.cpp's padded_columns): 70 rows run as 80 columns. Each row against a double-precision
// computation (the pre-activations kept for the backward too), the tail unwritten; and where oneDNN runs its
// AVX-512 kernels, whose column bits do not depend on the column count (expert_mlp.hpp), the first 64 rows
// alone (no padding) give the same bits.
TEST(ExpertMlp, ARaggedExpertRunOnPaddedColumnsMatchesPerRowReference) {
  const int64_t d = 24, h = 40, rows = 70, capacity = 72;
  ExpertWeights w{Tensor::empty({1, h, d}), Tensor::empty({1, h, d}), Tensor::empty({1, d, h})};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  fill_normal(w.w1, 41, 1, scale);
  fill_normal(w.w3, 41, 2, scale);
  fill_normal(w.w2, 41, 3, scale);
  Tensor x = poisoned({capacity, d});
  Tensor live = x.rows(0, rows);
  fill_normal(live, 41, 9, 1.0f);
  ExpertMlpState state;
  const Tensor y = forward_with_and_without_state(w, x, {0, rows}, &state);
  const int64_t ldp = state.gate_pre.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> m(static_cast<size_t>(h));
    for (int64_t j = 0; j < h; ++j) {
      double a = 0.0, b = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        a += double(w.w1.data<float>()[j * d + c]) * x.data<float>()[r * d + c];
        b += double(w.w3.data<float>()[j * d + c]) * x.data<float>()[r * d + c];
      }
      ASSERT_NEAR(state.gate_pre.data<float>()[r * ldp + j], a, 1e-5 * (1.0 + std::fabs(a))) << "row " << r;
      ASSERT_NEAR(state.up_pre.data<float>()[r * ldp + j], b, 1e-5 * (1.0 + std::fabs(b))) << "row " << r;
      m[static_cast<size_t>(j)] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int64_t i = 0; i < d; ++i) {
      double want = 0.0;
      for (int64_t j = 0; j < h; ++j)
        want += double(w.w2.data<float>()[i * h + j]) * m[static_cast<size_t>(j)];
      ASSERT_NEAR(y.data<float>()[r * d + i], want, 1e-5 + 1e-5 * std::fabs(want))
          << "row " << r << " col " << i;
    }
  }
  for (int64_t i = rows * d; i < capacity * d; ++i)
    ASSERT_TRUE(std::isnan(y.data<float>()[i])) << "tail at " << i;
  if (batch_invariant_rows() != 16)
    GTEST_SKIP() << "oneDNN's AVX2 kernels: a column's bits depend on the count";
  const Tensor first = forward_with_and_without_state(w, x, {0, 64});
  EXPECT_EQ(std::memcmp(first.raw(), y.raw(), static_cast<size_t>(64 * d) * sizeof(float)), 0)
      << "padding the columns changed the bits of the rows";
}

// Every gradient of `w`'s experts (the biases too, when it has them) and of the input against central finite
// differences of the loss Σ y·proj.
void expect_gradients_match_finite_differences(ExpertWeights w, Tensor x, uint64_t seed) {
  Tensor proj = Tensor::empty({kCapacity, kD});
  fill_normal(proj, seed, 10, 1.0f);
  auto loss = [&]() {
    Tensor y = poisoned({kCapacity, kD});
    expert_mlp_forward(x, PayloadFormat::F32, kOffsets, w, y, nullptr);
    double l = 0.0;
    for (int64_t i = 0; i < kOffsets.back() * kD; ++i)
      l += double(y.data<float>()[i]) * proj.data<float>()[i];
    return l;
  };
  Tensor y = poisoned({kCapacity, kD});
  ExpertMlpState state;
  expert_mlp_forward(x, PayloadFormat::F32, kOffsets, w, y, &state);
  ExpertWeights grads = testing::zeros_like(w);
  // Accumulation: start the gradients at 1 and check they grew by exactly the gradient.
  grads.w1.fill(1.0f);
  Tensor grad_in = poisoned({kCapacity, kD});
  expert_mlp_backward(proj, state, w, grad_in, grads);
  for (int64_t i = kOffsets.back() * kD; i < kCapacity * kD; ++i)
    EXPECT_TRUE(std::isnan(grad_in.data<float>()[i])) << "tail of grad_in written at " << i;
  auto check = [&](Tensor& param, const Tensor& grad, float offset, int64_t count, const char* name) {
    for (int64_t i = 0; i < count; ++i) {
      float& v = param.data<float>()[i];
      const float keep = v, eps = 1e-3f;
      v = keep + eps;
      const double up = loss();
      v = keep - eps;
      const double down = loss();
      v = keep;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(grad.data<float>()[i] - offset, fd, 2e-3 + 1e-2 * std::fabs(fd)) << name << "[" << i << "]";
    }
  };
  check(w.w1, grads.w1, 1.0f, w.w1.numel(), "w1");
  check(w.w3, grads.w3, 0.0f, w.w3.numel(), "w3");
  check(w.w2, grads.w2, 0.0f, w.w2.numel(), "w2");
  if (w.has_biases()) {
    check(w.b1, grads.b1, 0.0f, w.b1.numel(), "b1");
    check(w.b3, grads.b3, 0.0f, w.b3.numel(), "b3");
    check(w.b2, grads.b2, 0.0f, w.b2.numel(), "b2");
  }
  check(x, grad_in, 0.0f, kOffsets.back() * kD, "x");
  // The expert without rows gets exactly zero gradient (1 for w1, where the gradient started at 1).
  for (int64_t i = kH * kD; i < 2 * kH * kD; ++i) {
    EXPECT_EQ(grads.w1.data<float>()[i], 1.0f);
    EXPECT_EQ(grads.w3.data<float>()[i], 0.0f);
  }
}

TEST(ExpertMlp, GradientsMatchFiniteDifferences) {
  expect_gradients_match_finite_differences(random_weights(5), random_input(5), 5);
}

}  // namespace
}  // namespace expar

namespace expar {
namespace {

// gpt-oss's experts from SwiGLU ones: gate/up biases of standard deviation `gate_up_bias`, a down bias of 1,
// the clamped activation.
void make_gpt_oss(ExpertWeights& w, uint64_t seed, float gate_up_bias) {
  const int64_t local = w.local_count(), h = w.hidden(), d = w.model();
  w.b1 = Tensor::empty({local, h});
  w.b3 = Tensor::empty({local, h});
  w.b2 = Tensor::empty({local, d});
  fill_normal(w.b1, seed, 4, gate_up_bias);
  fill_normal(w.b3, seed, 5, gate_up_bias);
  fill_normal(w.b2, seed, 6, 1.0f);
  w.activation = ExpertMlpActivation::GptOssClamped;
}

ExpertWeights gpt_oss_weights(uint64_t seed) {
  ExpertWeights w = random_weights(seed);
  make_gpt_oss(w, seed, 2.0f);
  return w;
}

// Inputs scaled so that some pre-activations pass ±7 (both clamps bite).
Tensor gpt_oss_input(uint64_t seed) {
  Tensor x = random_input(seed);
  Tensor live = x.rows(0, kOffsets.back());
  for (float& v : live.span<float>()) v *= 6.0f;
  return x;
}

// gpt-oss's experts: gate/up biases before the clamped SwiGLU, the down bias after the down product, against
// a per-row double computation, with inputs large enough that both clamps bite.
TEST(ExpertMlp, GptOssClampedExpertsWithBiasesMatchPerRowComputation) {
  ExpertWeights w = gpt_oss_weights(21);
  Tensor x = gpt_oss_input(22);
  Tensor y = forward_with_and_without_state(w, x);
  int clamped = 0;
  for (int64_t r = 0; r < kOffsets.back(); ++r) {
    const int l = expert_of_row(r);
    const float* xr = x.data<float>() + r * kD;
    std::vector<double> m(static_cast<size_t>(kH));
    for (int64_t j = 0; j < kH; ++j) {
      double g = w.b1.data<float>()[l * kH + j], u = w.b3.data<float>()[l * kH + j];
      for (int64_t c = 0; c < kD; ++c) {
        g += static_cast<double>(w.w1.data<float>()[(l * kH + j) * kD + c]) * xr[c];
        u += static_cast<double>(w.w3.data<float>()[(l * kH + j) * kD + c]) * xr[c];
      }
      clamped += (g > 7.0) + (std::fabs(u) > 7.0);
      g = std::min(g, 7.0);
      u = std::clamp(u, -7.0, 7.0);
      m[static_cast<size_t>(j)] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    }
    for (int64_t c = 0; c < kD; ++c) {
      double want = w.b2.data<float>()[l * kD + c];
      for (int64_t j = 0; j < kH; ++j)
        want += static_cast<double>(w.w2.data<float>()[(l * kD + c) * kH + j]) * m[static_cast<size_t>(j)];
      EXPECT_NEAR(y.data<float>()[r * kD + c], want, 1e-4 * (1.0 + std::fabs(want))) << "row " << r;
    }
  }
  EXPECT_GT(clamped, 0) << "the inputs never reached a clamp";
  for (int64_t i = kOffsets.back() * kD; i < y.numel(); ++i) EXPECT_TRUE(std::isnan(y.data<float>()[i]));
}

// Their backward: every weight's, bias's and input's gradient against finite differences, the clamps active
// (a clamped pre-activation passes no gradient, which the differences see as a flat loss).
TEST(ExpertMlp, GptOssClampedExpertsGradientsMatchFiniteDifferences) {
  expect_gradients_match_finite_differences(gpt_oss_weights(23), gpt_oss_input(24), 25);
}

// Decode's experts, one row each (expert_mlp.cpp's forward_one_row_experts: every gate and up product in one
// matvec region, every down product in another): against the per-row double computation, SwiGLU and gpt-oss's
// biased, clamped experts, at a shape small enough for one thread and one whose products spread over the
// threads; the same bits with and without a state and at 1 and 2 compute threads; the saved pre-activations
// are w1·x and w3·x (biases added); the rows past the last offset and the expert without rows untouched.
void check_one_row_experts(int64_t d, int64_t h, bool gpt_oss, uint64_t seed) {
  const int64_t local = 3, capacity = 4;
  const std::vector<int64_t> offsets{0, 1, 1, 2};
  ExpertWeights w{Tensor::empty({local, h, d}), Tensor::empty({local, h, d}), Tensor::empty({local, d, h})};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  fill_normal(w.w1, seed, 1, scale);
  fill_normal(w.w3, seed, 2, scale);
  fill_normal(w.w2, seed, 3, scale);
  if (gpt_oss) make_gpt_oss(w, seed, 8.0f);
  Tensor x = poisoned({capacity, d});
  Tensor live = x.rows(0, 2);
  fill_normal(live, seed, 9, 1.0f);
  const int saved_threads = compute_threads();
  Tensor by_threads[2];
  for (const int threads : {1, 2}) {
    set_compute_threads(threads);
    ExpertMlpState state;
    Tensor y = forward_with_and_without_state(w, x, offsets, &state);
    by_threads[threads - 1] = y;
    int clamped = 0;
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t l = r == 0 ? 0 : 2;  // the rows' experts (expert 1 has none)
      const float* xr = x.data<float>() + r * d;
      std::vector<double> m(static_cast<size_t>(h));
      for (int64_t j = 0; j < h; ++j) {
        double g = gpt_oss ? w.b1.data<float>()[l * h + j] : 0.0,
               u = gpt_oss ? w.b3.data<float>()[l * h + j] : 0.0;
        for (int64_t c = 0; c < d; ++c) {
          g += static_cast<double>(w.w1.data<float>()[(l * h + j) * d + c]) * xr[c];
          u += static_cast<double>(w.w3.data<float>()[(l * h + j) * d + c]) * xr[c];
        }
        const int64_t ldp = state.gate_pre.dim(1);
        EXPECT_NEAR(state.gate_pre.data<float>()[r * ldp + j], g, 1e-4 * (1.0 + std::fabs(g)))
            << "gate " << j;
        EXPECT_NEAR(state.up_pre.data<float>()[r * ldp + j], u, 1e-4 * (1.0 + std::fabs(u))) << "up " << j;
        if (gpt_oss) {
          clamped += (g > 7.0) + (std::fabs(u) > 7.0);
          g = std::min(g, 7.0);
          u = std::clamp(u, -7.0, 7.0);
          m[static_cast<size_t>(j)] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
        } else {
          m[static_cast<size_t>(j)] = g / (1.0 + std::exp(-g)) * u;
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        double want = gpt_oss ? w.b2.data<float>()[l * d + c] : 0.0;
        for (int64_t j = 0; j < h; ++j)
          want += static_cast<double>(w.w2.data<float>()[(l * d + c) * h + j]) * m[static_cast<size_t>(j)];
        EXPECT_NEAR(y.data<float>()[r * d + c], want, 1e-4 * (1.0 + std::fabs(want)))
            << "row " << r << " col " << c;
      }
    }
    if (gpt_oss) {
      EXPECT_GT(clamped, 0) << "the inputs never reached a clamp";
    }
    for (int64_t i = 2 * d; i < capacity * d; ++i)
      ASSERT_TRUE(std::isnan(y.data<float>()[i])) << "tail written at " << i;
  }
  set_compute_threads(saved_threads);
  EXPECT_EQ(std::memcmp(by_threads[0].raw(), by_threads[1].raw(), by_threads[0].nbytes()), 0)
      << "the thread count changed bits";
}

TEST(ExpertMlp, DecodeExpertsOfOneRowEachMatchPerRowComputation) {
  check_one_row_experts(kD, kH, false, 31);
  check_one_row_experts(kD, kH, true, 32);
  // w1 of one expert is 128 Ki weights: the products spread over the threads (core/matvec).
  check_one_row_experts(256, 512, false, 33);
  check_one_row_experts(256, 512, true, 34);
}

}  // namespace
}  // namespace expar

namespace expar {
namespace {

// f32 weights rounded to BF16 (the narrow copy) and widened back (the f32 experts over the same values).
std::pair<Tensor, Tensor> bf16_and_widened(const Tensor& f32) {
  Tensor narrow = Tensor::empty(f32.shape(), DType::BF16);
  Tensor widened = Tensor::empty(f32.shape());
  auto* bits = static_cast<uint16_t*>(narrow.raw());
  for (int64_t i = 0; i < f32.numel(); ++i) {
    bits[i] = f32_to_bf16(f32.data<float>()[i]);
    widened.data<float>()[i] = bf16_to_f32(bits[i]);
  }
  return {narrow, widened};
}

// Experts held in BF16 run the row form (2 rows) and the column form (20 rows; 70, padded to 80 columns),
// their products decoding the weights tile by tile (core/weight_matmul.hpp: d and h cut into several tiles
// and a ragged last): each row equals the f32 experts' over the widened weights, the tail left unwritten.
TEST(ExpertMlp, Bf16ExpertsInBothFormsMatchTheF32ExpertsOverTheWidenedWeights) {
  const int64_t d = 1024, h = 300, local = 3;
  const std::vector<int64_t> offsets{0, 2, 22, 92};
  const int64_t capacity = offsets.back() + 3;
  Tensor w1 = Tensor::empty({local, h, d}), w3 = Tensor::empty({local, h, d}),
         w2 = Tensor::empty({local, d, h});
  fill_normal(w1, 52, 1, 1.0f / 32);
  fill_normal(w3, 52, 2, 1.0f / 32);
  fill_normal(w2, 52, 3, 1.0f / 17);
  auto [n1, f1] = bf16_and_widened(w1);
  auto [n3, f3] = bf16_and_widened(w3);
  auto [n2, f2] = bf16_and_widened(w2);
  const ExpertWeights narrow{n1, n3, n2}, widened{f1, f3, f2};
  Tensor x = poisoned({capacity, d});
  Tensor live = x.rows(0, offsets.back());
  fill_normal(live, 52, 9, 1.0f);
  Tensor got = poisoned({capacity, d}), want = poisoned({capacity, d});
  expert_mlp_forward(x, PayloadFormat::F32, offsets, narrow, got, nullptr);
  expert_mlp_forward(x, PayloadFormat::F32, offsets, widened, want, nullptr);
  for (int64_t i = 0; i < offsets.back() * d; ++i) {
    const float a = got.data<float>()[i], b = want.data<float>()[i];
    ASSERT_NEAR(a, b, 1e-5 * (1.0 + std::fabs(b))) << "row " << i / d << " col " << i % d;
  }
  for (int64_t i = offsets.back() * d; i < capacity * d; ++i)
    ASSERT_TRUE(std::isnan(got.data<float>()[i])) << "tail at " << i;
}

}  // namespace
}  // namespace expar
