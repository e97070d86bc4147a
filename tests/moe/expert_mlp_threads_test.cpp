// The grouped experts at 2 compute threads (moe/expert_mlp.hpp, core/parallel_tasks.hpp): the experts with
// rows are spread over the threads, each expert's products single-threaded with its own scratch, so the
// forward output, the saved pre-activations, the input gradient and every weight and bias gradient are the
// same bits as at 1 compute thread, for several expert/row layouts (empty experts, one expert alone, a tiny
// expert among large ones), with and without the batch-invariant minimum rows, SwiGLU and gpt-oss's biased
// clamped experts.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expert_fixtures.hpp"

namespace expar {
namespace {

constexpr int64_t kD = 96, kH = 160, kTail = 3;

ExpertWeights random_weights(int64_t experts, bool gpt_oss) {
  return testing::random_experts(experts, kD, kH, gpt_oss, 5);
}

// Gradients start from nonzero values: the weight gradients accumulate.
ExpertWeights random_like(const ExpertWeights& w) {
  auto random = [](const Tensor& t, uint64_t stream) {
    if (!t.defined() || t.numel() == 0) return Tensor();
    Tensor g = Tensor::empty(t.shape());
    fill_normal(g, 7, stream, 0.01f);
    return g;
  };
  ExpertWeights g{random(w.w1, 1), random(w.w3, 2), random(w.w2, 3),
                  random(w.b1, 4), random(w.b3, 5), random(w.b2, 6)};
  g.activation = w.activation;
  return g;
}

// Rows [recv, recv + kTail) are the capacity tail, poisoned and never written.
Tensor rows_of(int64_t recv, uint64_t stream) {
  Tensor t = Tensor::empty({recv + kTail, kD});
  fill_nan(t.raw(), t.nbytes());
  Tensor live = t.rows(0, recv);
  fill_normal(live, 11, stream, 1.0f);
  return t;
}

struct Outcome {
  Tensor y, gate_pre, up_pre, grad_in;
  ExpertWeights grads;
};

Outcome run(const std::vector<int64_t>& rows, bool gpt_oss, int threads, int64_t min_rows,
            bool bf16_products = false) {
  const int saved_threads = compute_threads();
  set_compute_threads(threads);
  set_matmul_min_rows(min_rows);
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  std::partial_sum(rows.begin(), rows.end(), offsets.begin() + 1);
  const int64_t recv = offsets.back();
  ExpertWeights w = random_weights(static_cast<int64_t>(rows.size()), gpt_oss);
  if (bf16_products) refresh_bf16_copies(w);
  Outcome r;
  r.y = rows_of(recv, 1);
  fill_nan(r.y.raw(), r.y.nbytes());
  ExpertMlpState state;
  expert_mlp_forward(rows_of(recv, 2), PayloadFormat::F32, offsets, w, r.y, &state);
  r.gate_pre = state.gate_pre;
  r.up_pre = state.up_pre;
  r.grad_in = rows_of(recv, 3);
  fill_nan(r.grad_in.raw(), r.grad_in.nbytes());
  r.grads = random_like(w);
  expert_mlp_backward(rows_of(recv, 4), state, w, r.grad_in, r.grads);
  set_matmul_min_rows(0);
  set_compute_threads(saved_threads);
  return r;
}

// The saved pre-activations: the first h columns of every row (the rest is the stride's padding, never
// written: ExpertMlpState).
void expect_same_pre_activation_bits(const Tensor& a, const Tensor& b, int64_t h, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_GE(a.dim(1), h) << what;
  // F32, or BF16 under BF16 products: compared as bytes, h elements a row.
  const size_t element = dtype_size(a.dtype());
  const size_t row_bytes = element * static_cast<size_t>(a.dim(1)),
               live_bytes = element * static_cast<size_t>(h);
  int64_t rows_differing = 0;
  for (int64_t r = 0; r < a.dim(0); ++r)
    rows_differing += std::memcmp(static_cast<const std::byte*>(a.raw()) + r * row_bytes,
                                  static_cast<const std::byte*>(b.raw()) + r * row_bytes, live_bytes) != 0;
  EXPECT_EQ(rows_differing, 0) << what << " differs between 1 and 2 threads";
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  if (!a.defined() && !b.defined()) return;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what << " differs between 1 and 2 threads";
}

TEST(ExpertMlpThreads, TwoComputeThreadsGiveTheBitsOfOne) {
  const std::vector<std::vector<int64_t>> layouts{
      {64, 48, 80, 32},           // every expert busy
      {7, 0, 120, 0, 1, 33, 16},  // empty experts, a 1-row and a 7-row expert among large ones
      {0, 0, 90, 0, 5, 0},        // two experts with rows
      {0, 0, 0, 70, 0},           // one expert alone: its products on both threads
      {0, 0, 0},                  // no rows at all
  };
  for (const auto& rows : layouts)
    for (bool gpt_oss : {false, true})
      for (int64_t min_rows : {int64_t{0}, batch_invariant_rows()}) {
        const std::string what = fmt::format("layout [{}], {}, min rows {}", fmt::join(rows, " "),
                                             gpt_oss ? "gpt-oss" : "swiglu", min_rows);
        const Outcome one = run(rows, gpt_oss, 1, min_rows);
        const Outcome two = run(rows, gpt_oss, 2, min_rows);
        expect_same_bits(one.y, two.y, what + ": output");
        expect_same_pre_activation_bits(one.gate_pre, two.gate_pre, kH, what + ": gate pre-activation");
        expect_same_pre_activation_bits(one.up_pre, two.up_pre, kH, what + ": up pre-activation");
        expect_same_bits(one.grad_in, two.grad_in, what + ": input gradient");
        expect_same_bits(one.grads.w1, two.grads.w1, what + ": w1 gradient");
        expect_same_bits(one.grads.w3, two.grads.w3, what + ": w3 gradient");
        expect_same_bits(one.grads.w2, two.grads.w2, what + ": w2 gradient");
        expect_same_bits(one.grads.b1, two.grads.b1, what + ": b1 gradient");
        expect_same_bits(one.grads.b3, two.grads.b3, what + ": b3 gradient");
        expect_same_bits(one.grads.b2, two.grads.b2, what + ": b2 gradient");
      }
}

// The same with BF16 products (moe/expert_mlp.hpp's BF16 copies; never under batch invariance, which they
// refuse): the experts' BF16 products on one thread each, a lone expert's on both.
TEST(ExpertMlpThreads, TwoComputeThreadsGiveTheBitsOfOneWithBf16Products) {
  if (dnnl_isa_name().rfind("avx512_core", 0) != 0)
    GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  const std::vector<std::vector<int64_t>> layouts{
      {64, 48, 80, 32}, {7, 0, 120, 0, 1, 33, 16}, {0, 0, 90, 0, 5, 0}, {0, 0, 0, 70, 0}, {0, 0, 0}};
  for (const auto& rows : layouts)
    for (bool gpt_oss : {false, true}) {
      const std::string what =
          fmt::format("BF16 products, layout [{}], {}", fmt::join(rows, " "), gpt_oss ? "gpt-oss" : "swiglu");
      const Outcome one = run(rows, gpt_oss, 1, 0, true);
      const Outcome two = run(rows, gpt_oss, 2, 0, true);
      expect_same_bits(one.y, two.y, what + ": output");
      expect_same_pre_activation_bits(one.gate_pre, two.gate_pre, kH, what + ": gate pre-activation");
      expect_same_pre_activation_bits(one.up_pre, two.up_pre, kH, what + ": up pre-activation");
      expect_same_bits(one.grad_in, two.grad_in, what + ": input gradient");
      expect_same_bits(one.grads.w1, two.grads.w1, what + ": w1 gradient");
      expect_same_bits(one.grads.w3, two.grads.w3, what + ": w3 gradient");
      expect_same_bits(one.grads.w2, two.grads.w2, what + ": w2 gradient");
      expect_same_bits(one.grads.b1, two.grads.b1, what + ": b1 gradient");
      expect_same_bits(one.grads.b3, two.grads.b3, what + ": b3 gradient");
      expect_same_bits(one.grads.b2, two.grads.b2, what + ": b2 gradient");
    }
}

}  // namespace
}  // namespace expar
