// Context-parallel multi-head latent attention over C = 2 and 3 chunks (threads: run_ranks) equals the
// whole-sequence latent_attention_forward/backward: every rank's output and input-gradient rows equal the
// whole sequence's rows of its chunk within 1e-5 relative (to 1 + |value|), and the weight gradients summed
// over the CP group equal the whole sequence's (1e-4, the tolerance of the ordinary CP attention test:
// sums in another order); with q = x·Wqᵀ and with the low-rank queries (Wq_a, q_a_norm, Wq_b). The CP
// forward gathers latent rows, not keys and values: its saved latent rows are the whole sequence's first
// (rank + 1)·S_c rows. Every rank builds the same inputs from the same seed.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "common/random_tensor.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/nn/context_parallel_attention.hpp"

namespace expar::nn {
namespace {

using test::randn;

constexpr int64_t kBatch = 2, kSeq = 12, kModel = 16;

struct Case {
  std::string name;
  int chunks;
  int64_t q_lora;
};

// nope ≠ v and a scale that is not (nope + rope)^-0.5, as tests/nn/latent_attention_test.cpp's.
LatentAttentionShape shape_of(const Case& c) {
  LatentAttentionShape s;
  s.n_heads = 3;
  s.q_lora_rank = c.q_lora;
  s.kv_lora_rank = 12;
  s.qk_nope_head_dim = 8;
  s.qk_rope_head_dim = 4;
  s.v_head_dim = 6;
  s.softmax_scale = 0.41;
  s.norm_eps = 1e-5f;
  return s;
}

Rope rope_of(const LatentAttentionShape& s) {
  return Rope(s.qk_rope_head_dim, kSeq, 10000.0, RopePairing::Interleaved);
}

Tensor gain(int64_t n, uint64_t stream) {
  Tensor g = randn({n}, stream, 0.2f);
  for (float& v : g.span<float>()) v += 1.0f;
  return g;
}

struct Inputs {
  LatentAttentionWeights w;
  Tensor x, grad_y;
};

Inputs make_inputs(const LatentAttentionShape& s) {
  const float in = 1.0f / std::sqrt(static_cast<float>(kModel));
  Inputs r;
  LatentAttentionWeights& w = r.w;
  // Large query weights: the softmax is far from uniform.
  if (s.q_lora_rank == 0) {
    w.wq = randn({s.q_width(), kModel}, 1, 3 * in);
  } else {
    w.wq_a = randn({s.q_lora_rank, kModel}, 2, in);
    w.q_a_norm = gain(s.q_lora_rank, 3);
    w.wq_b = randn({s.q_width(), s.q_lora_rank}, 4, 3.0f / std::sqrt(static_cast<float>(s.q_lora_rank)));
  }
  w.wkv_a = randn({s.kv_a_width(), kModel}, 5, in);
  w.kv_a_norm = gain(s.kv_lora_rank, 6);
  w.wkv_b = randn({s.kv_b_width(), s.kv_lora_rank}, 7, 1.0f / std::sqrt(static_cast<float>(s.kv_lora_rank)));
  w.wo = randn({kModel, s.context_width()}, 8, 1.0f / std::sqrt(static_cast<float>(s.context_width())));
  r.x = randn({kBatch * kSeq, kModel}, 9);
  r.grad_y = randn({kBatch * kSeq, kModel}, 10);
  return r;
}

Tensor zeros_like(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? Tensor::zeros(t.shape()) : Tensor{};
}

LatentAttentionGrads zero_grads(const LatentAttentionWeights& w) {
  return {zeros_like(w.wq),    zeros_like(w.wq_a),      zeros_like(w.q_a_norm), zeros_like(w.wq_b),
          zeros_like(w.wkv_a), zeros_like(w.kv_a_norm), zeros_like(w.wkv_b),    zeros_like(w.wo)};
}

std::vector<float> values(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.data<float>(), t.data<float>() + t.numel()};
}

// y, grad_x, and every weight gradient flattened in a fixed order (wq, wq_a, q_a_norm, wq_b, wkv_a,
// kv_a_norm, wkv_b, wo; undefined ones empty).
struct Result {
  std::vector<float> y, grad_x, weight_grads, latent;
};

Result collect(const Tensor& y, const Tensor& grad_x, const LatentAttentionGrads& g, const Tensor& latent) {
  Result r{values(y), values(grad_x), {}, values(latent)};
  for (const Tensor* t : {&g.wq, &g.wq_a, &g.q_a_norm, &g.wq_b, &g.wkv_a, &g.kv_a_norm, &g.wkv_b, &g.wo}) {
    std::vector<float> v = values(*t);
    r.weight_grads.insert(r.weight_grads.end(), v.begin(), v.end());
  }
  return r;
}

// Rows [c·S_c, (c+1)·S_c) of every sequence of t [B·S, d].
Tensor chunk_rows(const Tensor& t, int c, int chunks) {
  const int64_t len = kSeq / chunks, d = t.dim(1);
  Tensor out = Tensor::empty({kBatch * len, d});
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t s = 0; s < len; ++s)
      for (int64_t j = 0; j < d; ++j)
        out.data<float>()[(b * len + s) * d + j] = t.data<float>()[(b * kSeq + c * len + s) * d + j];
  return out;
}

class CpLatentAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CpLatentAttention, EqualsTheWholeSequenceForwardAndBackward) {
  const Case c = GetParam();
  const LatentAttentionShape s = shape_of(c);
  Result whole;
  {
    Inputs in = make_inputs(s);
    const Rope rope = rope_of(s);
    LatentAttentionSaved saved;
    Tensor y = latent_attention_forward(s, rope, in.w, in.x, kBatch, kSeq, &saved);
    EXPECT_EQ(saved.past, 0);
    EXPECT_EQ(saved.key_rows, kSeq);
    LatentAttentionGrads g = zero_grads(in.w);
    Tensor gx = latent_attention_backward(s, rope, in.w, saved, in.grad_y, g);
    whole = collect(y, gx, g, saved.latent);
  }
  std::vector<Result> chunks(static_cast<size_t>(c.chunks));
  std::mutex m;
  const int64_t len = kSeq / c.chunks;
  LaunchOptions launch;
  launch.ranks = c.chunks;
  run_ranks(launch, [&](Comm& cp) {
    Inputs in = make_inputs(s);
    const Rope rope = rope_of(s);
    LatentAttentionSaved saved;
    Tensor y = cp_latent_attention_forward(cp, s, rope, in.w, chunk_rows(in.x, cp.rank(), c.chunks), kBatch,
                                           len, &saved);
    EXPECT_EQ(saved.past, cp.rank() * len);
    EXPECT_EQ(saved.key_rows, (cp.rank() + 1) * len);
    LatentAttentionGrads g = zero_grads(in.w);
    Tensor gx =
        cp_latent_attention_backward(cp, s, rope, in.w, saved, chunk_rows(in.grad_y, cp.rank(), c.chunks), g);
    Result r = collect(y, gx, g, saved.latent);
    std::lock_guard lock(m);
    chunks[static_cast<size_t>(cp.rank())] = std::move(r);
  });

  const int64_t width = s.kv_a_width();
  for (int rank = 0; rank < c.chunks; ++rank) {
    const Result& r = chunks[static_cast<size_t>(rank)];
    ASSERT_EQ(r.y.size(), static_cast<size_t>(kBatch * len * kModel));
    ASSERT_EQ(r.grad_x.size(), r.y.size());
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t p = 0; p < len; ++p)
        for (int64_t j = 0; j < kModel; ++j) {
          const auto mine = static_cast<size_t>((b * len + p) * kModel + j);
          const auto full = static_cast<size_t>((b * kSeq + rank * len + p) * kModel + j);
          EXPECT_NEAR(r.y[mine], whole.y[full], 1e-5 * (1.0 + std::fabs(whole.y[full])))
              << "y, rank " << rank << " seq " << b << " pos " << p;
          EXPECT_NEAR(r.grad_x[mine], whole.grad_x[full], 1e-5 * (1.0 + std::fabs(whole.grad_x[full])))
              << "grad_x, rank " << rank << " seq " << b << " pos " << p;
        }
    // The gathered latent rows: positions [0, (rank + 1)·S_c) of every sequence, as the whole computes them.
    const int64_t key_rows = (rank + 1) * len;
    ASSERT_EQ(r.latent.size(), static_cast<size_t>(kBatch * key_rows * width));
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t p = 0; p < key_rows; ++p)
        for (int64_t j = 0; j < width; ++j) {
          const float want = whole.latent[static_cast<size_t>((b * kSeq + p) * width + j)];
          EXPECT_NEAR(r.latent[static_cast<size_t>((b * key_rows + p) * width + j)], want,
                      1e-6 * (1.0 + std::fabs(want)))
              << "latent row, rank " << rank << " seq " << b << " pos " << p;
        }
  }
  ASSERT_FALSE(whole.weight_grads.empty());
  for (size_t i = 0; i < whole.weight_grads.size(); ++i) {
    double sum = 0.0;
    for (const Result& r : chunks) sum += r.weight_grads[i];
    EXPECT_NEAR(sum, whole.weight_grads[i], 1e-4 * (1.0 + std::fabs(whole.weight_grads[i])))
        << "weight gradient element " << i;
  }
  // The last chunk's queries see every chunk's keys: its gradient is not the whole gradient alone.
  double apart = 0.0;
  for (size_t i = 0; i < whole.weight_grads.size(); ++i)
    apart = std::max(apart,
                     std::fabs(static_cast<double>(chunks.back().weight_grads[i]) - whole.weight_grads[i]));
  EXPECT_GT(apart, 1e-3) << "the chunks' shares must all contribute";
}

INSTANTIATE_TEST_SUITE_P(Chunks, CpLatentAttention,
                         ::testing::Values(Case{"q_direct_c2", 2, 0}, Case{"q_direct_c3", 3, 0},
                                           Case{"q_lora_c2", 2, 6}, Case{"q_lora_c3", 3, 6}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(CpLatentAttention, RefusesASequenceBeyondTheRopeAndABackwardOnAnotherChunk) {
  const LatentAttentionShape s = shape_of(Case{"", 2, 0});
  std::mutex m;
  std::vector<std::string> errors;
  LaunchOptions launch;
  launch.ranks = 2;
  run_ranks(launch, [&](Comm& cp) {
    Inputs in = make_inputs(s);
    const Rope short_rope(s.qk_rope_head_dim, kSeq - 1, 10000.0, RopePairing::Interleaved);
    const Tensor x = chunk_rows(in.x, cp.rank(), 2);
    std::string first, second;
    try {
      cp_latent_attention_forward(cp, s, short_rope, in.w, x, kBatch, kSeq / 2, nullptr);
    } catch (const Error& e) {
      first = e.what();
    }
    // A saved chunk of position 0 handed to CP rank 1's backward (local check, before any collective).
    const Rope rope = rope_of(s);
    LatentAttentionSaved saved;
    Tensor y = latent_attention_forward(s, rope, in.w, x, kBatch, kSeq / 2, &saved);
    LatentAttentionGrads g = zero_grads(in.w);
    if (cp.rank() == 1) {
      try {
        cp_latent_attention_backward(cp, s, rope, in.w, saved, y, g);
      } catch (const Error& e) {
        second = e.what();
      }
    }
    std::lock_guard lock(m);
    errors.push_back(first);
    if (cp.rank() == 1) errors.push_back(second);
  });
  ASSERT_EQ(errors.size(), 3u);
  for (const std::string& e : errors) EXPECT_FALSE(e.empty());
  bool rope_named = false, chunk_named = false;
  for (const std::string& e : errors) {
    rope_named |= e.find("exceeds the Rope's max_positions=11") != std::string::npos;
    chunk_named |= e.find("this is CP rank 1") != std::string::npos;
  }
  EXPECT_TRUE(rope_named);
  EXPECT_TRUE(chunk_named);
}

}  // namespace
}  // namespace expar::nn
