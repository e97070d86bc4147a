#include "expar/nn/attention.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/close.hpp"
#include "common/random_tensor.hpp"
#include "expar/core/matmul.hpp"
#include "expar/nn/attention_phases.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using test::max_abs_diff;
using test::randn;
using testing::expect_gradient;
using testing::project;

constexpr double kTheta = 10000.0;

AttentionWeights random_weights(const AttentionShape& s, int64_t d, uint64_t stream) {
  const float std_in = 1.0f / std::sqrt(static_cast<float>(d));
  const float std_out = 1.0f / std::sqrt(static_cast<float>(s.n_heads * s.head_dim));
  // Larger query weights make the softmax far from uniform, so the check exercises it.
  return {randn({s.n_heads * s.head_dim, d}, stream + 1, 3 * std_in),
          randn({s.n_kv_heads * s.head_dim, d}, stream + 2, 3 * std_in),
          randn({s.n_kv_heads * s.head_dim, d}, stream + 3, std_in),
          randn({d, s.n_heads * s.head_dim}, stream + 4, std_out)};
}

AttentionGrads zero_grads(const AttentionWeights& w) {
  return {Tensor::zeros(w.wq.shape()), Tensor::zeros(w.wk.shape()), Tensor::zeros(w.wv.shape()),
          Tensor::zeros(w.wo.shape())};
}

// Straightforward attention in double: projections, rotate-half RoPE, causal softmax, output projection;
// with `opt`, its biases, sinks (an extra exp(sink) in each softmax denominator) and sliding window.
std::vector<double> reference_attention(const AttentionShape& s, const AttentionWeights& w, const Tensor& x,
                                        int64_t batch, int64_t seq, const AttentionOptions& opt = {}) {
  const int64_t d = x.dim(1), hd = s.head_dim, half = hd / 2, n = batch * seq;
  auto bias = [](const Tensor& b, int64_t i) {
    return b.defined() && b.numel() > 0 ? b.data<float>()[i] : 0.0;
  };
  auto proj = [&](const Tensor& wt, int64_t heads, const Tensor& b) {
    std::vector<double> out(static_cast<size_t>(n * heads * hd));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < heads * hd; ++o) {
        double acc = bias(b, o);
        for (int64_t k = 0; k < d; ++k)
          acc += static_cast<double>(x.data<float>()[r * d + k]) * wt.data<float>()[o * d + k];
        out[static_cast<size_t>(r * heads * hd + o)] = acc;
      }
    return out;
  };
  auto rope = [&](std::vector<double>& t, int64_t heads) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(r % seq) * std::pow(kTheta, -2.0 * i / hd);
          double& a = t[static_cast<size_t>(r * heads * hd + h * hd + i)];
          double& b = t[static_cast<size_t>(r * heads * hd + h * hd + i + half)];
          const double a0 = a, b0 = b;
          a = a0 * std::cos(angle) - b0 * std::sin(angle);
          b = b0 * std::cos(angle) + a0 * std::sin(angle);
        }
  };
  std::vector<double> q = proj(w.wq, s.n_heads, opt.bq), k = proj(w.wk, s.n_kv_heads, opt.bk),
                      v = proj(w.wv, s.n_kv_heads, opt.bv);
  rope(q, s.n_heads);
  rope(k, s.n_kv_heads);
  const int64_t qd = s.n_heads * hd, kd = s.n_kv_heads * hd;
  std::vector<double> ctx(static_cast<size_t>(n * qd), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t g = h / (s.n_heads / s.n_kv_heads);
      for (int64_t i = 0; i < seq; ++i) {
        std::vector<double> p(static_cast<size_t>(i + 1), -INFINITY);
        const bool sink = opt.sinks.defined() && opt.sinks.numel() > 0;
        double max = sink ? opt.sinks.data<float>()[h] : -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (opt.window > 0 && i - j >= opt.window) continue;
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[static_cast<size_t>((b * seq + i) * qd + h * hd + e)] *
                   k[static_cast<size_t>((b * seq + j) * kd + g * hd + e)];
          p[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          max = std::max(max, p[static_cast<size_t>(j)]);
        }
        if (sink) sum = std::exp(opt.sinks.data<float>()[h] - max);
        for (double& pj : p) sum += (pj = std::exp(pj - max));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e)
            ctx[static_cast<size_t>((b * seq + i) * qd + h * hd + e)] +=
                p[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((b * seq + j) * kd + g * hd + e)];
      }
    }
  std::vector<double> y(static_cast<size_t>(n * d), 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < d; ++o) {
      y[static_cast<size_t>(r * d + o)] = bias(opt.bo, o);
      for (int64_t c = 0; c < qd; ++c)
        y[static_cast<size_t>(r * d + o)] +=
            ctx[static_cast<size_t>(r * qd + c)] * w.wo.data<float>()[o * qd + c];
    }
  return y;
}

class AttentionHeads : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {
 protected:
  AttentionShape shape() const { return {GetParam().first, GetParam().second, 4}; }
};

TEST_P(AttentionHeads, ForwardMatchesNaiveReference) {
  const AttentionShape s = shape();
  const int64_t batch = 2, seq = 7, d = 12;
  Rope rope(s.head_dim, seq, kTheta);
  AttentionWeights w = random_weights(s, d, 10);
  Tensor x = randn({batch * seq, d}, 1);
  AttentionSaved saved;
  Tensor y = attention_forward(s, rope, w, x, batch, seq, &saved);
  std::vector<double> ref = reference_attention(s, w, x, batch, seq);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_NEAR(y.data<float>()[i], ref[static_cast<size_t>(i)],
                1e-5 * (1 + std::fabs(ref[static_cast<size_t>(i)])))
        << i;
  // Saved probabilities: rows sum to 1, exactly zero above the diagonal, and not uniform.
  const float* p = saved.probs.data<float>();
  double spread = 0;
  for (int64_t bh = 0; bh < batch * s.n_heads; ++bh)
    for (int64_t i = 0; i < seq; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < seq; ++j) {
        const float pij = p[(bh * seq + i) * seq + j];
        if (j > i) {
          EXPECT_EQ(pij, 0.0f);
        }
        sum += pij;
        if (j <= i) spread += std::fabs(pij - 1.0 / static_cast<double>(i + 1));
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  EXPECT_GT(spread, 1.0);
  // Without saved state the result is the same.
  Tensor y2 = attention_forward(s, rope, w, x, batch, seq, nullptr);
  EXPECT_EQ(max_abs_diff(y, y2), 0.0);
}

TEST_P(AttentionHeads, LaterTokensDoNotChangeEarlierOutputs) {
  const AttentionShape s = shape();
  const int64_t batch = 2, seq = 6, d = 8, changed = 3;
  Rope rope(s.head_dim, seq);
  AttentionWeights w = random_weights(s, d, 20);
  Tensor x = randn({batch * seq, d}, 1);
  Tensor y = attention_forward(s, rope, w, x, batch, seq, nullptr);
  Tensor x2 = x.clone();
  for (int64_t j = 0; j < d; ++j) x2.data<float>()[changed * d + j] += 1.5f;  // sequence 0, token 3
  Tensor y2 = attention_forward(s, rope, w, x2, batch, seq, nullptr);
  for (int64_t r = 0; r < batch * seq; ++r) {
    double diff = 0;
    for (int64_t j = 0; j < d; ++j)
      diff = std::max(
          diff, std::fabs(static_cast<double>(y.data<float>()[r * d + j]) - y2.data<float>()[r * d + j]));
    if (r < changed || r >= seq) {
      EXPECT_EQ(diff, 0.0) << "row " << r << " changed";
    } else {
      EXPECT_GT(diff, 1e-4) << "row " << r << " should see token " << changed;
    }
  }
}

TEST_P(AttentionHeads, GradientsMatchFiniteDifferences) {
  const AttentionShape s = shape();
  const int64_t batch = 2, seq = 5, d = 8;
  Rope rope(s.head_dim, seq);
  AttentionWeights w = random_weights(s, d, 30);
  Tensor x = randn({batch * seq, d}, 1), r = randn({batch * seq, d}, 2);
  AttentionSaved saved;
  attention_forward(s, rope, w, x, batch, seq, &saved);
  AttentionGrads g = zero_grads(w);
  Tensor gx = attention_backward(s, rope, w, saved, r, g);
  auto loss = [&] { return project(r, attention_forward(s, rope, w, x, batch, seq, nullptr)); };
  // The f32 rounding of the loss is ~1e-4 of the largest gradient component here: 5e-3 leaves margin and
  // still fails a 1% error in any part of the backward pass.
  const double h = 1e-2, rtol = 5e-3;
  expect_gradient("attention grad_x", loss, x, gx, h, rtol);
  expect_gradient("attention grad_wq", loss, w.wq, g.wq, h, rtol);
  expect_gradient("attention grad_wk", loss, w.wk, g.wk, h, rtol);
  expect_gradient("attention grad_wv", loss, w.wv, g.wv, h, rtol);
  expect_gradient("attention grad_wo", loss, w.wo, g.wo, h, rtol);
}

TEST_P(AttentionHeads, CachedForwardMatchesFullForward) {
  const AttentionShape s = shape();
  const int64_t batch = 3, seq = 7, d = 8;
  Rope rope(s.head_dim, 16);
  AttentionWeights w = random_weights(s, d, 40);
  Tensor x = randn({batch * seq, d}, 1);
  Tensor full = attention_forward(s, rope, w, x, batch, seq, nullptr);
  std::vector<KvCache> caches;
  for (int64_t b = 0; b < batch; ++b) caches.push_back(KvCache::create(8, s));
  std::vector<KvCache*> ptrs = {&caches[0], &caches[1], &caches[2]};
  // Steps of different sizes per sequence (prefill, chunks, single-token decode, nothing).
  const std::vector<std::vector<int64_t>> steps = {{4, 1, 7}, {1, 2, 0}, {2, 1, 0}, {0, 3, 0}};
  Tensor out = Tensor::empty({batch * seq, d});
  for (const auto& step : steps) {
    std::vector<int64_t> starts;
    int64_t total = 0;
    for (int64_t b = 0; b < batch; ++b) {
      starts.push_back(caches[static_cast<size_t>(b)].length);
      total += step[static_cast<size_t>(b)];
    }
    Tensor xs = Tensor::empty({total, d});
    for (int64_t b = 0, row = 0; b < batch; ++b)
      for (int64_t t = 0; t < step[static_cast<size_t>(b)]; ++t, ++row)
        std::copy_n(x.data<float>() + (b * seq + starts[static_cast<size_t>(b)] + t) * d, d,
                    xs.data<float>() + row * d);
    Tensor ys = attention_forward_cached(s, rope, w, xs, step, ptrs);
    for (int64_t b = 0, row = 0; b < batch; ++b)
      for (int64_t t = 0; t < step[static_cast<size_t>(b)]; ++t, ++row)
        std::copy_n(ys.data<float>() + row * d, d,
                    out.data<float>() + (b * seq + starts[static_cast<size_t>(b)] + t) * d);
  }
  for (int64_t b = 0; b < batch; ++b) EXPECT_EQ(caches[static_cast<size_t>(b)].length, seq);
  EXPECT_LT(max_abs_diff(out, full), 1e-5);
  EXPECT_GT(max_abs_diff(full, Tensor::zeros(full.shape())), 1e-2);  // the comparison is not between zeros
}

INSTANTIATE_TEST_SUITE_P(Heads, AttentionHeads,
                         ::testing::Values(std::pair<int64_t, int64_t>{3, 3},
                                           std::pair<int64_t, int64_t>{4, 2},
                                           std::pair<int64_t, int64_t>{2, 1}),
                         [](const auto& info) {
                           return "h" + std::to_string(info.param.first) + "_kv" +
                                  std::to_string(info.param.second);
                         });

Tensor columns(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty({rows, end - begin});
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(t.data<float>() + r * cols + begin, end - begin, out.data<float>() + r * (end - begin));
  return out;
}

TEST(Attention, HeadsSplitAcrossTensorParallelRanksSumToTheWhole) {
  const AttentionShape whole{4, 2, 4};
  const AttentionShape local{2, 1, 4};
  const int64_t batch = 2, seq = 5, d = 8, hd = 4;
  Rope rope(hd, seq);
  AttentionWeights w = random_weights(whole, d, 50);
  Tensor x = randn({batch * seq, d}, 1), r = randn({batch * seq, d}, 2);
  AttentionSaved saved;
  Tensor y = attention_forward(whole, rope, w, x, batch, seq, &saved);
  AttentionGrads g = zero_grads(w);
  Tensor gx = attention_backward(whole, rope, w, saved, r, g);
  Tensor y_sum = Tensor::zeros(y.shape()), gx_sum = Tensor::zeros(gx.shape());
  for (int64_t rank = 0; rank < 2; ++rank) {
    AttentionWeights wl{
        w.wq.rows(rank * 2 * hd, (rank + 1) * 2 * hd).clone(), w.wk.rows(rank * hd, (rank + 1) * hd).clone(),
        w.wv.rows(rank * hd, (rank + 1) * hd).clone(), columns(w.wo, rank * 2 * hd, (rank + 1) * 2 * hd)};
    AttentionSaved sl;
    Tensor yl = attention_forward(local, rope, wl, x, batch, seq, &sl);
    AttentionGrads gl = zero_grads(wl);
    Tensor gxl = attention_backward(local, rope, wl, sl, r, gl);
    for (int64_t i = 0; i < y.numel(); ++i) {
      y_sum.data<float>()[i] += yl.data<float>()[i];
      gx_sum.data<float>()[i] += gxl.data<float>()[i];
    }
    EXPECT_LT(max_abs_diff(gl.wq, g.wq.rows(rank * 2 * hd, (rank + 1) * 2 * hd)), 1e-5);
    EXPECT_LT(max_abs_diff(gl.wk, g.wk.rows(rank * hd, (rank + 1) * hd)), 1e-5);
    EXPECT_LT(max_abs_diff(gl.wv, g.wv.rows(rank * hd, (rank + 1) * hd)), 1e-5);
    EXPECT_LT(max_abs_diff(gl.wo, columns(g.wo, rank * 2 * hd, (rank + 1) * 2 * hd)), 1e-5);
  }
  EXPECT_LT(max_abs_diff(y_sum, y), 1e-5);
  EXPECT_LT(max_abs_diff(gx_sum, gx), 1e-5);
}

// Inference options (Hugging Face Qwen-MoE / gpt-oss): q/k/v/o biases, per-head sinks and a sliding window,
// through the cache in chunks (prefill, single tokens), against the double reference with the same options.
TEST(Attention, CachedForwardWithBiasesSinksAndWindowMatchesTheReference) {
  const AttentionShape s{4, 2, 4};
  const int64_t d = 8, seq = 9;
  Rope rope(s.head_dim, 16, kTheta);
  AttentionWeights w = random_weights(s, d, 70);
  Tensor x = randn({seq, d}, 3);
  for (int64_t window : {0, 1, 3}) {
    for (bool sinks : {false, true}) {
      AttentionOptions o;
      o.bq = randn({16}, 71, 0.5f);
      o.bk = randn({8}, 72, 0.5f);
      o.bv = randn({8}, 73, 0.5f);
      o.bo = randn({d}, 74, 0.5f);
      if (sinks) o.sinks = randn({4}, 75, 1.0f);
      o.window = window;
      const std::vector<double> ref = reference_attention(s, w, x, 1, seq, o);
      KvCache cache = KvCache::create(seq, s);
      std::vector<KvCache*> ptrs = {&cache};
      int64_t row = 0;
      for (int64_t chunk : {4, 1, 1, 3}) {
        const std::vector<int64_t> counts = {chunk};
        Tensor y = attention_forward_cached(s, rope, w, x.rows(row, row + chunk).clone(), counts, ptrs, o);
        for (int64_t i = 0; i < chunk * d; ++i) {
          const double want = ref[static_cast<size_t>(row * d + i)];
          EXPECT_NEAR(y.data<float>()[i], want, 1e-5 * (1 + std::fabs(want)))
              << "window " << window << " sinks " << sinks << " row " << row + i / d;
        }
        row += chunk;
      }
    }
  }
  // The options change the result (the reference is not blind to them), and plain options give the plain
  // reference.
  AttentionOptions windowed;
  windowed.window = 2;
  EXPECT_GT(std::fabs(reference_attention(s, w, x, 1, seq, windowed)[8 * d] -
                      reference_attention(s, w, x, 1, seq)[8 * d]),
            1e-4);
  AttentionOptions bad;
  bad.sinks = randn({3}, 76);  // 4 heads
  KvCache cache = KvCache::create(seq, s);
  std::vector<KvCache*> ptrs = {&cache};
  const std::vector<int64_t> one = {1};
  EXPECT_THROW(attention_forward_cached(s, rope, w, randn({1, d}, 1), one, ptrs, bad), Error);
  EXPECT_EQ(cache.length, 0);
}

// Sequences longer than a row block (attention_phases' kAttentionRowBlock): each block of query rows is
// multiplied against only the keys its last row sees. Chunks of 70, 1 and 66 rows of a 137-token sequence
// cross block edges with and without a past, with windows and sinks, against the double reference; the
// training forward over the whole sequence too, whose saved probabilities must stay zero where masked.
// Then the heads spread over 2 compute threads give the same bits as 1 thread, also with batch-invariant
// products on (the workers must take the caller's minimum row count).
TEST(Attention, LongSequencesMatchTheReferenceAcrossRowBlocksAndThreadCounts) {
  const AttentionShape s{4, 2, 4};
  const int64_t d = 8, seq = 2 * nn::phases::kAttentionRowBlock + 9;
  Rope rope(s.head_dim, seq, kTheta);
  AttentionWeights w = random_weights(s, d, 80);
  Tensor x = randn({seq, d}, 5);
  const std::vector<int64_t> chunks = {70, 1, 66};
  auto cached = [&](const AttentionOptions& o) {
    KvCache cache = KvCache::create(seq, s);
    std::vector<KvCache*> ptrs = {&cache};
    Tensor y = Tensor::empty({seq, d});
    int64_t row = 0;
    for (int64_t chunk : chunks) {
      const std::vector<int64_t> counts = {chunk};
      Tensor part = attention_forward_cached(s, rope, w, x.rows(row, row + chunk).clone(), counts, ptrs, o);
      std::memcpy(y.data<float>() + row * d, part.data<float>(),
                  sizeof(float) * static_cast<size_t>(chunk * d));
      row += chunk;
    }
    return y;
  };
  for (int64_t window : {0, 50}) {
    for (bool sinks : {false, true}) {
      AttentionOptions o;
      o.window = window;
      if (sinks) o.sinks = randn({4}, 81, 1.0f);
      const std::vector<double> ref = reference_attention(s, w, x, 1, seq, o);
      const Tensor y = cached(o);
      AttentionSaved saved;
      const Tensor yt = attention_forward(s, rope, w, x, 1, seq, &saved, o);
      for (int64_t i = 0; i < seq * d; ++i) {
        const double want = ref[static_cast<size_t>(i)];
        ASSERT_NEAR(y.data<float>()[i], want, 1e-5 * (1 + std::fabs(want)))
            << "cached, window " << window << " sinks " << sinks << " row " << i / d;
        ASSERT_NEAR(yt.data<float>()[i], want, 1e-5 * (1 + std::fabs(want)))
            << "training, window " << window << " sinks " << sinks << " row " << i / d;
      }
      const float* p = saved.probs.data<float>();
      for (int64_t h = 0; h < s.n_heads; ++h)
        for (int64_t i = 0; i < seq; ++i)
          for (int64_t j = 0; j < seq; ++j)
            if (j > i || (window > 0 && j <= i - window)) {
              ASSERT_EQ(p[(h * seq + i) * seq + j], 0.0f) << i << " " << j;
            }
      for (const int64_t min_rows : {int64_t{0}, batch_invariant_rows()}) {
        set_matmul_min_rows(min_rows);
        set_compute_threads(2);
        const Tensor y2 = cached(o);
        const Tensor yt2 = attention_forward(s, rope, w, x, 1, seq, nullptr, o);
        set_compute_threads(1);
        const Tensor y1 = cached(o);
        const Tensor yt1 = attention_forward(s, rope, w, x, 1, seq, nullptr, o);
        set_matmul_min_rows(0);
        EXPECT_EQ(std::memcmp(y1.raw(), y2.raw(), y1.nbytes()), 0) << "min rows " << min_rows;
        EXPECT_EQ(std::memcmp(yt1.raw(), yt2.raw(), yt1.nbytes()), 0) << "min rows " << min_rows;
      }
    }
  }
}

// The training functions with the families' options (biases, sinks, windows; q/k norms below): the forward
// equals the double reference (and so the cached inference forward above), and every option's gradient
// matches central differences.
TEST(Attention, TrainingWithBiasesSinksAndWindowMatchesTheReferenceAndFiniteDifferences) {
  const AttentionShape s{4, 2, 4};
  const int64_t batch = 2, seq = 6, d = 8;
  Rope rope(s.head_dim, seq, kTheta);
  AttentionWeights w = random_weights(s, d, 80);
  Tensor x = randn({batch * seq, d}, 4), r = randn({batch * seq, d}, 5);
  for (int64_t window : {0, 3}) {
    AttentionOptions o;
    o.bq = randn({16}, 81, 0.5f);
    o.bk = randn({8}, 82, 0.5f);
    o.bv = randn({8}, 83, 0.5f);
    o.bo = randn({d}, 84, 0.5f);
    o.sinks = randn({4}, 85, 1.0f);
    o.window = window;
    AttentionSaved saved;
    const Tensor y = attention_forward(s, rope, w, x, batch, seq, &saved, o);
    const std::vector<double> ref = reference_attention(s, w, x, batch, seq, o);
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_NEAR(y.data<float>()[i], ref[static_cast<size_t>(i)],
                  1e-5 * (1 + std::fabs(ref[static_cast<size_t>(i)])))
          << "window " << window << " element " << i;
    AttentionGrads g = zero_grads(w);
    AttentionOptionGrads og{Tensor::zeros({16}), Tensor::zeros({8}), Tensor::zeros({8}),
                            Tensor::zeros({d}),  Tensor(),           Tensor(),
                            Tensor::zeros({4})};
    Tensor gx = attention_backward(s, rope, w, saved, r, g, o, &og);
    auto loss = [&] { return project(r, attention_forward(s, rope, w, x, batch, seq, nullptr, o)); };
    const double h = 1e-2, rtol = 5e-3;
    const std::string tag = " (window " + std::to_string(window) + ")";
    expect_gradient("grad_x" + tag, loss, x, gx, h, rtol);
    expect_gradient("grad_wq" + tag, loss, w.wq, g.wq, h, rtol);
    expect_gradient("grad_wk" + tag, loss, w.wk, g.wk, h, rtol);
    expect_gradient("grad_bq" + tag, loss, o.bq, og.bq, h, rtol);
    expect_gradient("grad_bk" + tag, loss, o.bk, og.bk, h, rtol);
    expect_gradient("grad_bv" + tag, loss, o.bv, og.bv, h, rtol);
    expect_gradient("grad_bo" + tag, loss, o.bo, og.bo, h, rtol);
    // The sinks' gradients are small beside the loss's f32 rounding: a wider step (Richardson-extrapolated,
    // smooth in the sink logit) keeps the difference quotient above that noise.
    expect_gradient("grad_sinks" + tag, loss, o.sinks, og.sinks, 5e-2, rtol);
  }
}

// q/k RMSNorm per head (Qwen3) and over the whole projection (OLMoE): training forward == the cached
// inference forward (which the engine tests hold to the families' references), and the gains' and the
// input's gradients match central differences.
TEST(Attention, TrainingWithQkNormsMatchesTheCachedForwardAndFiniteDifferences) {
  const AttentionShape s{4, 2, 4};
  const int64_t seq = 7, d = 8;
  Rope rope(s.head_dim, seq, kTheta);
  AttentionWeights w = random_weights(s, d, 90);
  Tensor x = randn({seq, d}, 6), r = randn({seq, d}, 7);
  for (QkNorm norm : {QkNorm::PerHead, QkNorm::Projection}) {
    const bool per_head = norm == QkNorm::PerHead;
    AttentionOptions o;
    o.qk_norm = norm;
    o.q_norm = randn({per_head ? 4 : 16}, 91, 0.3f);
    o.k_norm = randn({per_head ? 4 : 8}, 92, 0.3f);
    for (Tensor* gain : {&o.q_norm, &o.k_norm})
      for (float& v : gain->span<float>()) v += 1.0f;
    o.bk = randn({8}, 93, 0.5f);
    AttentionSaved saved;
    const Tensor y = attention_forward(s, rope, w, x, 1, seq, &saved, o);
    KvCache cache = KvCache::create(seq, s);
    std::vector<KvCache*> ptrs = {&cache};
    const std::vector<int64_t> counts = {seq};
    const Tensor cached = attention_forward_cached(s, rope, w, x, counts, ptrs, o);
    for (int64_t i = 0; i < y.numel(); ++i)
      ASSERT_NEAR(y.data<float>()[i], cached.data<float>()[i],
                  1e-5 * (1 + std::fabs(cached.data<float>()[i])))
          << (per_head ? "per head" : "projection") << " element " << i;
    AttentionGrads g = zero_grads(w);
    AttentionOptionGrads og;
    og.bk = Tensor::zeros({8});
    og.q_norm = Tensor::zeros(o.q_norm.shape());
    og.k_norm = Tensor::zeros(o.k_norm.shape());
    Tensor gx = attention_backward(s, rope, w, saved, r, g, o, &og);
    auto loss = [&] { return project(r, attention_forward(s, rope, w, x, 1, seq, nullptr, o)); };
    const double h = 1e-2, rtol = 5e-3;
    const std::string tag = per_head ? " (per head)" : " (projection)";
    expect_gradient("grad_x" + tag, loss, x, gx, h, rtol);
    expect_gradient("grad_wq" + tag, loss, w.wq, g.wq, h, rtol);
    expect_gradient("grad_wk" + tag, loss, w.wk, g.wk, h, rtol);
    expect_gradient("grad_bk" + tag, loss, o.bk, og.bk, h, rtol);
    expect_gradient("grad_q_norm" + tag, loss, o.q_norm, og.q_norm, h, rtol);
    expect_gradient("grad_k_norm" + tag, loss, o.k_norm, og.k_norm, h, rtol);
  }
}

TEST(Attention, RejectsBadShapesAndLeavesCachesUntouched) {
  const AttentionShape s{4, 2, 4};
  const int64_t d = 8;
  Rope rope(4, 16);
  AttentionWeights w = random_weights(s, d, 60);
  Tensor x = randn({6, d}, 1);
  EXPECT_THROW(attention_forward(AttentionShape{4, 3, 4}, rope, w, x, 2, 3, nullptr), Error);
  EXPECT_THROW(attention_forward(s, rope, w, x, 2, 4, nullptr), Error);         // 8 rows expected
  EXPECT_THROW(attention_forward(s, Rope(8, 16), w, x, 2, 3, nullptr), Error);  // rope head_dim differs
  EXPECT_THROW(attention_forward(s, rope, w, randn({34, d}, 1), 2, 17, nullptr),
               Error);  // beyond max_positions
  KvCache a = KvCache::create(4, s), b = KvCache::create(4, s);
  a.length = 3;
  std::vector<KvCache*> ptrs = {&a, &b};
  const std::vector<int64_t> counts = {2, 1};  // sequence 0 would overflow its cache
  EXPECT_THROW(attention_forward_cached(s, rope, w, randn({3, d}, 1), counts, ptrs), Error);
  EXPECT_EQ(a.length, 3);
  EXPECT_EQ(b.length, 0);
  std::vector<KvCache*> twice = {&b, &b};
  const std::vector<int64_t> ones = {1, 1};
  EXPECT_THROW(attention_forward_cached(s, rope, w, randn({2, d}, 1), ones, twice), Error);
  EXPECT_EQ(b.length, 0);
}

}  // namespace
}  // namespace expar::nn
