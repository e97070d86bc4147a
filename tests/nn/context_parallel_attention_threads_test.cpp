// Context-parallel attention over C = 2 and 3 chunks equals the whole-sequence attention_forward/backward:
// every rank's output and input-gradient rows equal the whole sequence's rows of its chunk, and the weight
// and option gradients summed over the CP group equal the whole sequence's; with grouped key/value heads,
// q/k/v/o biases, sinks, a sliding window that crosses chunk boundaries, and q/k norms per head and over
// the projection. Every rank builds the same inputs from the same seed.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/random_tensor.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/nn/context_parallel_attention.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::randn;

struct Case {
  std::string name;
  int chunks;
  int64_t window;
  QkNorm norm;
  bool sinks_and_biases;
};

constexpr int64_t kBatch = 2, kSeq = 12, kModel = 8;
const AttentionShape kShape{4, 2, 4};

struct Inputs {
  AttentionWeights w;
  AttentionOptions o;
  Tensor x, grad_y;
};

Inputs make_inputs(const Case& c) {
  const int64_t qd = kShape.n_heads * kShape.head_dim, kd = kShape.n_kv_heads * kShape.head_dim;
  Inputs in{{randn({qd, kModel}, 1, 1.0f), randn({kd, kModel}, 2, 1.0f), randn({kd, kModel}, 3, 0.4f),
             randn({kModel, qd}, 4, 0.3f)},
            {},
            randn({kBatch * kSeq, kModel}, 5),
            randn({kBatch * kSeq, kModel}, 6)};
  AttentionOptions& o = in.o;
  o.window = c.window;
  if (c.sinks_and_biases) {
    o.bq = randn({qd}, 7, 0.5f);
    o.bk = randn({kd}, 8, 0.5f);
    o.bv = randn({kd}, 9, 0.5f);
    o.bo = randn({kModel}, 10, 0.5f);
    o.sinks = randn({kShape.n_heads}, 11);
  }
  o.qk_norm = c.norm;
  if (c.norm != QkNorm::None) {
    const bool per_head = c.norm == QkNorm::PerHead;
    o.q_norm = randn({per_head ? kShape.head_dim : qd}, 12, 0.3f);
    o.k_norm = randn({per_head ? kShape.head_dim : kd}, 13, 0.3f);
    for (Tensor* gain : {&o.q_norm, &o.k_norm})
      for (float& v : gain->span<float>()) v += 1.0f;
  }
  return in;
}

// Every gradient of one backward, flattened in a fixed order: grad_x, wq, wk, wv, wo, then the options'.
struct Result {
  std::vector<float> y, grad_x, weight_grads;
};

std::vector<float> values(const Tensor& t) {
  if (!t.defined()) return {};
  return {t.data<float>(), t.data<float>() + t.numel()};
}

Result collect(const Tensor& y, const Tensor& grad_x, const AttentionGrads& g,
               const AttentionOptionGrads& og) {
  Result r{values(y), values(grad_x), {}};
  for (const Tensor* t :
       {&g.wq, &g.wk, &g.wv, &g.wo, &og.bq, &og.bk, &og.bv, &og.bo, &og.q_norm, &og.k_norm, &og.sinks}) {
    std::vector<float> v = values(*t);
    r.weight_grads.insert(r.weight_grads.end(), v.begin(), v.end());
  }
  return r;
}

AttentionGrads zero_like(const AttentionWeights& w) {
  return {Tensor::zeros(w.wq.shape()), Tensor::zeros(w.wk.shape()), Tensor::zeros(w.wv.shape()),
          Tensor::zeros(w.wo.shape())};
}

AttentionOptionGrads zero_like(const AttentionOptions& o) {
  auto z = [](const Tensor& t) { return t.defined() ? Tensor::zeros(t.shape()) : Tensor(); };
  return {z(o.bq), z(o.bk), z(o.bv), z(o.bo), z(o.q_norm), z(o.k_norm), z(o.sinks)};
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

Result whole_sequence(const Case& c) {
  Inputs in = make_inputs(c);
  Rope rope(kShape.head_dim, kSeq);
  AttentionSaved saved;
  Tensor y = attention_forward(kShape, rope, in.w, in.x, kBatch, kSeq, &saved, in.o);
  AttentionGrads g = zero_like(in.w);
  AttentionOptionGrads og = zero_like(in.o);
  Tensor gx = attention_backward(kShape, rope, in.w, saved, in.grad_y, g, in.o, &og);
  return collect(y, gx, g, og);
}

class CpAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CpAttention, EqualsTheWholeSequenceForwardAndBackward) {
  const Case c = GetParam();
  const Result whole = whole_sequence(c);
  std::vector<Result> chunks(static_cast<size_t>(c.chunks));
  std::mutex m;
  LaunchOptions launch;
  launch.ranks = c.chunks;
  run_ranks(launch, [&](Comm& cp) {
    Inputs in = make_inputs(c);
    Rope rope(kShape.head_dim, kSeq);
    AttentionSaved saved;
    const int64_t len = kSeq / c.chunks;
    Tensor y = cp_attention_forward(cp, kShape, rope, in.w, chunk_rows(in.x, cp.rank(), c.chunks), kBatch,
                                    len, &saved, in.o);
    EXPECT_EQ(saved.past, cp.rank() * len);
    AttentionGrads g = zero_like(in.w);
    AttentionOptionGrads og = zero_like(in.o);
    Tensor gx = cp_attention_backward(cp, kShape, rope, in.w, saved,
                                      chunk_rows(in.grad_y, cp.rank(), c.chunks), g, in.o, &og);
    Result r = collect(y, gx, g, og);
    std::lock_guard lock(m);
    chunks[static_cast<size_t>(cp.rank())] = std::move(r);
  });

  const int64_t len = kSeq / c.chunks;
  for (int rank = 0; rank < c.chunks; ++rank) {
    const Result& r = chunks[static_cast<size_t>(rank)];
    ASSERT_EQ(r.y.size(), static_cast<size_t>(kBatch * len * kModel));
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t s = 0; s < len; ++s)
        for (int64_t j = 0; j < kModel; ++j) {
          const auto mine = static_cast<size_t>((b * len + s) * kModel + j);
          const auto full = static_cast<size_t>((b * kSeq + rank * len + s) * kModel + j);
          EXPECT_NEAR(r.y[mine], whole.y[full], 2e-6 * (1.0 + std::fabs(whole.y[full])))
              << "y, rank " << rank << " seq " << b << " pos " << s;
          EXPECT_NEAR(r.grad_x[mine], whole.grad_x[full], 1e-5 * (1.0 + std::fabs(whole.grad_x[full])))
              << "grad_x, rank " << rank << " seq " << b << " pos " << s;
        }
  }
  ASSERT_FALSE(whole.weight_grads.empty());
  for (size_t i = 0; i < whole.weight_grads.size(); ++i) {
    double sum = 0.0;
    for (const Result& r : chunks) sum += r.weight_grads[i];
    EXPECT_NEAR(sum, whole.weight_grads[i], 1e-4 * (1.0 + std::fabs(whole.weight_grads[i])))
        << "weight/option gradient element " << i;
  }
  // The last chunk's queries see keys of every chunk: its gradient is not the whole gradient alone.
  double apart = 0.0;
  for (size_t i = 0; i < whole.weight_grads.size(); ++i)
    apart = std::max(apart,
                     std::fabs(static_cast<double>(chunks.back().weight_grads[i]) - whole.weight_grads[i]));
  EXPECT_GT(apart, 1e-3) << "the chunks' shares must all contribute";
}

INSTANTIATE_TEST_SUITE_P(Chunks, CpAttention,
                         ::testing::Values(Case{"plain_c2", 2, 0, QkNorm::None, false},
                                           Case{"plain_c3", 3, 0, QkNorm::None, false},
                                           Case{"window_sinks_biases_c2", 2, 5, QkNorm::None, true},
                                           Case{"window_sinks_biases_c3", 3, 5, QkNorm::None, true},
                                           Case{"per_head_norm_window_c3", 3, 3, QkNorm::PerHead, true},
                                           Case{"projection_norm_c2", 2, 0, QkNorm::Projection, true}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(CpAttention, RefusesASequenceBeyondTheRopeAndABackwardOnAnotherChunk) {
  const Case c{"plain", 2, 0, QkNorm::None, false};
  std::mutex m;
  std::vector<std::string> errors;
  LaunchOptions launch;
  launch.ranks = 2;
  run_ranks(launch, [&](Comm& cp) {
    Inputs in = make_inputs(c);
    Rope short_rope(kShape.head_dim, kSeq - 1);
    const Tensor x = chunk_rows(in.x, cp.rank(), 2);
    std::string first, second;
    try {
      cp_attention_forward(cp, kShape, short_rope, in.w, x, kBatch, kSeq / 2, nullptr, in.o);
    } catch (const Error& e) {
      first = e.what();
    }
    // A saved chunk of position 0 handed to CP rank 1's backward (local check, before any collective).
    Rope rope(kShape.head_dim, kSeq);
    AttentionSaved saved;
    Tensor y = attention_forward(kShape, rope, in.w, x, kBatch, kSeq / 2, &saved, in.o);
    AttentionGrads g = zero_like(in.w);
    if (cp.rank() == 1) {
      try {
        cp_attention_backward(cp, kShape, rope, in.w, saved, y, g, in.o);
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
