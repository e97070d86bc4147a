#include "expar/nn/latent_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/close.hpp"
#include "common/random_tensor.hpp"
#include "core/expect_error.hpp"
#include "expar/core/tensor_convert.hpp"
#include "nn/test_util.hpp"

namespace expar::nn {
namespace {

using expar::testing::expect_error;
using test::close;
using test::randn;
using test::Tolerance;
using testing::expect_gradient;
using testing::project;

constexpr double kTheta = 10000.0;

// nope ≠ v, a scale that is not (nope + rope)^-0.5, and (q_lora > 0) an eps that is not the default.
LatentAttentionShape small_shape(int64_t q_lora) {
  LatentAttentionShape s;
  s.n_heads = 3;
  s.q_lora_rank = q_lora;
  s.kv_lora_rank = 12;
  s.qk_nope_head_dim = 8;
  s.qk_rope_head_dim = 4;
  s.v_head_dim = 6;
  s.softmax_scale = 0.41;
  s.norm_eps = q_lora > 0 ? 1e-3f : 1e-6f;
  return s;
}

Rope rope_for(const LatentAttentionShape& s, int64_t max_positions) {
  return Rope(s.qk_rope_head_dim, max_positions, kTheta, RopePairing::Interleaved);
}

Tensor gain(int64_t n, uint64_t stream) {
  Tensor g = randn({n}, stream, 0.2f);
  for (float& v : g.span<float>()) v += 1.0f;
  return g;
}

LatentAttentionWeights random_weights(const LatentAttentionShape& s, int64_t d, uint64_t stream) {
  const float in = 1.0f / std::sqrt(static_cast<float>(d));
  LatentAttentionWeights w;
  // Larger query weights make the softmax far from uniform.
  if (s.q_lora_rank == 0) {
    w.wq = randn({s.q_width(), d}, stream + 1, 3 * in);
  } else {
    w.wq_a = randn({s.q_lora_rank, d}, stream + 2, in);
    w.q_a_norm = gain(s.q_lora_rank, stream + 3);
    w.wq_b =
        randn({s.q_width(), s.q_lora_rank}, stream + 4, 3.0f / std::sqrt(static_cast<float>(s.q_lora_rank)));
  }
  w.wkv_a = randn({s.kv_a_width(), d}, stream + 5, in);
  w.kv_a_norm = gain(s.kv_lora_rank, stream + 6);
  w.wkv_b = randn({s.kv_b_width(), s.kv_lora_rank}, stream + 7,
                  1.0f / std::sqrt(static_cast<float>(s.kv_lora_rank)));
  w.wo = randn({d, s.context_width()}, stream + 8, 1.0f / std::sqrt(static_cast<float>(s.context_width())));
  return w;
}

Tensor zeros_like(const Tensor& t) {
  return t.defined() && t.numel() > 0 ? Tensor::zeros(t.shape()) : Tensor{};
}

LatentAttentionGrads zero_grads(const LatentAttentionWeights& w) {
  return {zeros_like(w.wq),    zeros_like(w.wq_a),      zeros_like(w.q_a_norm), zeros_like(w.wq_b),
          zeros_like(w.wkv_a), zeros_like(w.kv_a_norm), zeros_like(w.wkv_b),    zeros_like(w.wo)};
}

// ---------------------------------------------------------------------------------------------------------
// An independent statement of the architecture in double with plain loops: its own RMSNorm, its own
// interleaved RoPE (pairs (2i, 2i + 1) at angle pos·theta^(-2i/rope)), its own causal softmax.

double at(const Tensor& t, int64_t r, int64_t c) {
  return t.data<float>()[r * t.dim(1) + c];
}

std::vector<double> matvec(const Tensor& w, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(w.dim(0)), 0.0);
  for (int64_t o = 0; o < w.dim(0); ++o)
    for (int64_t i = 0; i < w.dim(1); ++i)
      y[static_cast<size_t>(o)] += at(w, o, i) * x[static_cast<size_t>(i)];
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const Tensor& g, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g.data<float>()[i];
  return y;
}

void rope_pairs(double* v, int64_t dim, int64_t position) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double angle =
        static_cast<double>(position) * std::pow(kTheta, -2.0 * static_cast<double>(i) / dim);
    const double a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * std::cos(angle) - b * std::sin(angle);
    v[2 * i + 1] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// y [B·S, d] of B sequences of S tokens at positions 0..S-1 (f32 weights).
std::vector<double> reference(const LatentAttentionShape& s, const LatentAttentionWeights& w, const Tensor& x,
                              int64_t batch, int64_t seq) {
  const int64_t d = x.dim(1), n = batch * seq, H = s.n_heads, nope = s.qk_nope_head_dim,
                rope = s.qk_rope_head_dim, vd = s.v_head_dim, qk = nope + rope, r = s.kv_lora_rank;
  std::vector<std::vector<double>> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)),
      v(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> xt(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) xt[static_cast<size_t>(i)] = at(x, t, i);
    std::vector<double> qt = s.q_lora_rank == 0
                                 ? matvec(w.wq, xt)
                                 : matvec(w.wq_b, rms_norm(matvec(w.wq_a, xt), w.q_a_norm, s.norm_eps));
    std::vector<double> kv_a = matvec(w.wkv_a, xt);
    std::vector<double> c(kv_a.begin(), kv_a.begin() + r), k_rope(kv_a.begin() + r, kv_a.end());
    std::vector<double> kv = matvec(w.wkv_b, rms_norm(c, w.kv_a_norm, s.norm_eps));
    const int64_t position = t % seq;
    rope_pairs(k_rope.data(), rope, position);
    std::vector<double> kt(static_cast<size_t>(H * qk)), vt(static_cast<size_t>(H * vd));
    for (int64_t h = 0; h < H; ++h) {
      rope_pairs(qt.data() + h * qk + nope, rope, position);
      for (int64_t e = 0; e < nope; ++e)
        kt[static_cast<size_t>(h * qk + e)] = kv[static_cast<size_t>(h * (nope + vd) + e)];
      for (int64_t e = 0; e < rope; ++e)
        kt[static_cast<size_t>(h * qk + nope + e)] = k_rope[static_cast<size_t>(e)];
      for (int64_t e = 0; e < vd; ++e)
        vt[static_cast<size_t>(h * vd + e)] = kv[static_cast<size_t>(h * (nope + vd) + nope + e)];
    }
    q[static_cast<size_t>(t)] = qt;
    k[static_cast<size_t>(t)] = kt;
    v[static_cast<size_t>(t)] = vt;
  }
  std::vector<double> y(static_cast<size_t>(n * d), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i) {
      const auto t = static_cast<size_t>(b * seq + i);
      std::vector<double> ctx(static_cast<size_t>(H * vd), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> score(static_cast<size_t>(i + 1));
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < qk; ++e)
            dot += q[t][static_cast<size_t>(h * qk + e)] *
                   k[static_cast<size_t>(b * seq + j)][static_cast<size_t>(h * qk + e)];
          score[static_cast<size_t>(j)] = dot * s.softmax_scale;
          max = std::max(max, score[static_cast<size_t>(j)]);
        }
        for (double& e : score) sum += (e = std::exp(e - max));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < vd; ++e)
            ctx[static_cast<size_t>(h * vd + e)] +=
                score[static_cast<size_t>(j)] / sum *
                v[static_cast<size_t>(b * seq + j)][static_cast<size_t>(h * vd + e)];
      }
      std::vector<double> yt = matvec(w.wo, ctx);
      std::copy(yt.begin(), yt.end(), y.begin() + static_cast<std::ptrdiff_t>(t) * d);
    }
  return y;
}

std::vector<float> as_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

std::vector<float> rows_of(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t c = t.dim(1);
  return {t.data<float>() + begin * c, t.data<float>() + end * c};
}

// ---------------------------------------------------------------------------------------------------------

class LatentAttentionQ : public ::testing::TestWithParam<int64_t> {};  // q_lora_rank

TEST_P(LatentAttentionQ, ForwardMatchesTheDoubleReference) {
  const LatentAttentionShape s = small_shape(GetParam());
  const int64_t batch = 2, seq = 5, d = 16;
  const Rope rope = rope_for(s, seq);
  const LatentAttentionWeights w = random_weights(s, d, 10);
  const Tensor x = randn({batch * seq, d}, 1);
  LatentAttentionSaved saved;
  const Tensor y = latent_attention_forward(s, rope, w, x, batch, seq, &saved);
  EXPECT_TRUE(close(std::span<const float>(y.span<float>()), as_float(reference(s, w, x, batch, seq)),
                    Tolerance::relative_to_largest(1e-5)));
  // The same without `saved`; the saved probabilities are causal, rows summing to 1, far from uniform.
  EXPECT_EQ(test::max_abs_diff(latent_attention_forward(s, rope, w, x, batch, seq, nullptr), y), 0.0);
  const float* p = saved.probs.data<float>();
  double largest = 0;
  for (int64_t bh = 0; bh < batch * s.n_heads; ++bh)
    for (int64_t i = 0; i < seq; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < seq; ++j) {
        const float pij = p[(bh * seq + i) * seq + j];
        if (j > i) {
          EXPECT_EQ(pij, 0.0f);
        }
        sum += pij;
        if (i == seq - 1) largest = std::max(largest, static_cast<double>(pij));
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  EXPECT_GT(largest, 0.4);  // uniform over 5 keys would be 0.2
}

TEST_P(LatentAttentionQ, BackwardMatchesFiniteDifferencesOfEveryWeightAndX) {
  const LatentAttentionShape s = small_shape(GetParam());
  const int64_t batch = 2, seq = 5, d = 16, n = batch * seq;
  const Rope rope = rope_for(s, seq);
  LatentAttentionWeights w = random_weights(s, d, 20);
  Tensor x = randn({n, d}, 2);
  const Tensor r = randn({n, d}, 3);
  LatentAttentionSaved saved;
  latent_attention_forward(s, rope, w, x, batch, seq, &saved);
  LatentAttentionGrads g = zero_grads(w);
  const Tensor grad_x = latent_attention_backward(s, rope, w, saved, r, g);
  // The loss Σ r·y of the double-precision reference (no f32 rounding noise in the differences), at the
  // f32 values perturbed in place; central differences Richardson-extrapolated (test_util.hpp), each
  // element within 1e-4 relative on the tensor's scale.
  auto loss = [&] {
    const std::vector<double> y = reference(s, w, x, batch, seq);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * r.data<float>()[i];
    return sum;
  };
  expect_gradient("x", loss, x, grad_x, 1e-2, 1e-4);
  if (s.q_lora_rank == 0) {
    expect_gradient("wq", loss, w.wq, g.wq, 1e-2, 1e-4);
  } else {
    expect_gradient("wq_a", loss, w.wq_a, g.wq_a, 1e-2, 1e-4);
    expect_gradient("q_a_norm", loss, w.q_a_norm, g.q_a_norm, 1e-2, 1e-4);
    expect_gradient("wq_b", loss, w.wq_b, g.wq_b, 1e-2, 1e-4);
  }
  expect_gradient("wkv_a", loss, w.wkv_a, g.wkv_a, 1e-2, 1e-4);
  expect_gradient("kv_a_norm", loss, w.kv_a_norm, g.kv_a_norm, 1e-2, 1e-4);
  expect_gradient("wkv_b", loss, w.wkv_b, g.wkv_b, 1e-2, 1e-4);
  expect_gradient("wo", loss, w.wo, g.wo, 1e-2, 1e-4);
  // The gradients are added into `grads`: a second backward doubles them.
  LatentAttentionSaved again;
  latent_attention_forward(s, rope, w, x, batch, seq, &again);
  const LatentAttentionGrads once = {g.wq.defined() ? g.wq.clone() : Tensor{},
                                     g.wq_a.defined() ? g.wq_a.clone() : Tensor{},
                                     g.q_a_norm.defined() ? g.q_a_norm.clone() : Tensor{},
                                     g.wq_b.defined() ? g.wq_b.clone() : Tensor{},
                                     g.wkv_a.clone(),
                                     g.kv_a_norm.clone(),
                                     g.wkv_b.clone(),
                                     g.wo.clone()};
  latent_attention_backward(s, rope, w, again, r, g);
  auto doubled = [](const Tensor& twice, const Tensor& one) {
    if (!one.defined()) return;
    for (int64_t i = 0; i < one.numel(); ++i)
      EXPECT_NEAR(twice.data<float>()[i], 2 * one.data<float>()[i],
                  1e-6 * (1 + std::fabs(one.data<float>()[i])));
  };
  doubled(g.wq, once.wq);
  doubled(g.wq_a, once.wq_a);
  doubled(g.q_a_norm, once.q_a_norm);
  doubled(g.wq_b, once.wq_b);
  doubled(g.wkv_a, once.wkv_a);
  doubled(g.kv_a_norm, once.kv_a_norm);
  doubled(g.wkv_b, once.wkv_b);
  doubled(g.wo, once.wo);
}

INSTANTIATE_TEST_SUITE_P(QLoraRank, LatentAttentionQ, ::testing::Values<int64_t>(10, 0),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param > 0 ? std::string("LowRankQ") : std::string("PlainQ");
                         });

// Heads [h0, h1) of a whole layer's weights, as a TP rank holds them.
LatentAttentionWeights head_slice(const LatentAttentionShape& s, const LatentAttentionWeights& w, int64_t h0,
                                  int64_t h1) {
  auto rows = [](const Tensor& t, int64_t per_head, int64_t a, int64_t b) {
    return t.rows(a * per_head, b * per_head).clone();
  };
  auto cols = [](const Tensor& t, int64_t per_head, int64_t a, int64_t b) {
    const int64_t rows_n = t.dim(0), c0 = a * per_head, c1 = b * per_head;
    Tensor out = Tensor::empty({rows_n, c1 - c0});
    for (int64_t i = 0; i < rows_n; ++i)
      std::memcpy(out.data<float>() + i * (c1 - c0), t.data<float>() + i * t.dim(1) + c0,
                  sizeof(float) * static_cast<size_t>(c1 - c0));
    return out;
  };
  LatentAttentionWeights part = w;
  if (s.q_lora_rank == 0)
    part.wq = rows(w.wq, s.qk_head_dim(), h0, h1);
  else
    part.wq_b = rows(w.wq_b, s.qk_head_dim(), h0, h1);
  part.wkv_b = rows(w.wkv_b, s.qk_nope_head_dim + s.v_head_dim, h0, h1);
  part.wo = cols(w.wo, s.v_head_dim, h0, h1);
  return part;
}

TEST(LatentAttention, HeadsSplitAcrossTensorParallelRanksSumToTheWhole) {
  for (int64_t q_lora : {10, 0}) {
    SCOPED_TRACE(q_lora);
    const LatentAttentionShape s = small_shape(q_lora);
    const int64_t batch = 2, seq = 5, d = 16, n = batch * seq;
    const Rope rope = rope_for(s, seq);
    const LatentAttentionWeights w = random_weights(s, d, 30);
    const Tensor x = randn({n, d}, 4), r = randn({n, d}, 5);
    LatentAttentionSaved saved;
    const Tensor y = latent_attention_forward(s, rope, w, x, batch, seq, &saved);
    LatentAttentionGrads g = zero_grads(w);
    const Tensor grad_x = latent_attention_backward(s, rope, w, saved, r, g);

    Tensor y_sum = Tensor::zeros({n, d}), gx_sum = Tensor::zeros({n, d});
    // The replicated weights' gradients are partial sums over the local heads too.
    LatentAttentionGrads replicated_sum = zero_grads(w);
    const int64_t splits[3] = {0, 2, 3};  // heads {0, 1} and {2}
    for (int part = 0; part < 2; ++part) {
      LatentAttentionShape local = s;
      local.n_heads = splits[part + 1] - splits[part];
      const LatentAttentionWeights wl = head_slice(s, w, splits[part], splits[part + 1]);
      LatentAttentionSaved sl;
      add_into(y_sum, latent_attention_forward(local, rope, wl, x, batch, seq, &sl));
      LatentAttentionGrads gl = zero_grads(wl);
      add_into(gx_sum, latent_attention_backward(local, rope, wl, sl, r, gl));
      add_into(replicated_sum.wkv_a, gl.wkv_a);
      add_into(replicated_sum.kv_a_norm, gl.kv_a_norm);
      if (q_lora) {
        add_into(replicated_sum.wq_a, gl.wq_a);
        add_into(replicated_sum.q_a_norm, gl.q_a_norm);
      }
      // The local heads' weight gradients are the whole's slices.
      const LatentAttentionWeights g_slice = head_slice(s, g, splits[part], splits[part + 1]);
      EXPECT_TRUE(close(gl.wkv_b, g_slice.wkv_b, Tolerance::relative_to_largest(1e-5)));
      EXPECT_TRUE(close(gl.wo, g_slice.wo, Tolerance::relative_to_largest(1e-5)));
      EXPECT_TRUE(close(q_lora ? gl.wq_b : gl.wq, q_lora ? g_slice.wq_b : g_slice.wq,
                        Tolerance::relative_to_largest(1e-5)));
    }
    EXPECT_TRUE(close(y_sum, y, Tolerance::relative_to_largest(1e-5)));
    EXPECT_TRUE(close(gx_sum, grad_x, Tolerance::relative_to_largest(1e-5)));
    EXPECT_TRUE(close(replicated_sum.wkv_a, g.wkv_a, Tolerance::relative_to_largest(1e-5)));
    EXPECT_TRUE(close(replicated_sum.kv_a_norm, g.kv_a_norm, Tolerance::relative_to_largest(1e-5)));
    if (q_lora) {
      EXPECT_TRUE(close(replicated_sum.wq_a, g.wq_a, Tolerance::relative_to_largest(1e-5)));
      EXPECT_TRUE(close(replicated_sum.q_a_norm, g.q_a_norm, Tolerance::relative_to_largest(1e-5)));
    }
  }
}

// Two sequences of 8 and 6 tokens through the caches in steps: prefill 3 and 4, then 2 more and one more in
// one call (a prefill and a decode step together), then one token at a time (the shorter sequence stopping
// early). Every step's rows must equal the whole-sequence forward's rows; the caches hold the forward's
// latent rows and nothing else.
void expect_cached_steps_match(const LatentAttentionShape& s, const LatentAttentionWeights& w,
                               const LatentAttentionWeights& w_f32, int64_t d, LatentForm form) {
  const int64_t lengths[2] = {8, 6};
  const Rope rope = rope_for(s, 16);
  Tensor xs[2] = {randn({lengths[0], d}, 40), randn({lengths[1], d}, 41)};
  Tensor want[2];
  LatentAttentionSaved saved[2];
  for (int i = 0; i < 2; ++i)
    want[i] = latent_attention_forward(s, rope, w_f32, xs[i], 1, lengths[i], &saved[i]);

  LatentKvCache caches[2] = {LatentKvCache::create(10, s), LatentKvCache::create(7, s)};
  for (auto& c : caches) {
    ASSERT_EQ(c.latent.shape(), (Shape{c.capacity(), s.kv_lora_rank + s.qk_rope_head_dim}));
    c.latent.fill(std::numeric_limits<float>::quiet_NaN());  // rows nobody wrote must never be read
  }
  LatentKvCache* ptrs[2] = {&caches[0], &caches[1]};
  std::vector<std::vector<int64_t>> steps = {{3, 4}, {2, 1}, {1, 1}, {1, 0}, {1, 0}};
  for (const auto& step : steps) {
    const int64_t total = step[0] + step[1];
    Tensor x = Tensor::empty({total, d});
    for (int i = 0, row = 0; i < 2; ++i)
      for (int64_t t = 0; t < step[static_cast<size_t>(i)]; ++t, ++row)
        std::memcpy(x.data<float>() + row * d, xs[i].data<float>() + (caches[i].length + t) * d,
                    sizeof(float) * static_cast<size_t>(d));
    const int64_t before[2] = {caches[0].length, caches[1].length};
    const Tensor y = latent_attention_forward_cached(s, rope, w, x, step, ptrs, form);
    ASSERT_EQ(y.shape(), (Shape{total, d}));
    for (int i = 0, row = 0; i < 2; ++i) {
      const int64_t tq = step[static_cast<size_t>(i)];
      EXPECT_EQ(caches[i].length, before[i] + tq);
      EXPECT_TRUE(close(rows_of(y, row, row + tq), rows_of(want[i], before[i], before[i] + tq),
                        Tolerance::relative_to_largest(1e-5)))
          << "sequence " << i << " positions " << before[i] << "..";
      row += static_cast<int>(tq);
    }
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(caches[i].length, lengths[i]);
    EXPECT_TRUE(close(rows_of(caches[i].latent, 0, lengths[i]), rows_of(saved[i].latent, 0, lengths[i]),
                      Tolerance::relative_to_largest(1e-6)));
    for (int64_t p = lengths[i]; p < caches[i].capacity(); ++p)
      EXPECT_TRUE(std::isnan(caches[i].latent.data<float>()[p * caches[i].latent.dim(1)]));
  }
}

TEST(LatentAttention, CachedStepsInBothFormsMatchTheWholeSequence) {
  for (int64_t q_lora : {10, 0})
    for (LatentForm form : {LatentForm::Expanded, LatentForm::Absorbed}) {
      SCOPED_TRACE(::testing::Message()
                   << "q_lora " << q_lora << " absorbed " << (form == LatentForm::Absorbed));
      const LatentAttentionShape s = small_shape(q_lora);
      const LatentAttentionWeights w = random_weights(s, 16, 50);
      expect_cached_steps_match(s, w, w, 16, form);
    }
}

// Every matrix converted by `convert`, and its f32 values (what the stored weight stands for).
std::pair<LatentAttentionWeights, LatentAttentionWeights> held_as(const LatentAttentionWeights& w,
                                                                  Tensor (*convert)(const Tensor&,
                                                                                    MemCategory)) {
  LatentAttentionWeights held = w, values = w;
  for (auto member :
       {&LatentAttentionWeights::wq, &LatentAttentionWeights::wq_a, &LatentAttentionWeights::wq_b,
        &LatentAttentionWeights::wkv_a, &LatentAttentionWeights::wkv_b, &LatentAttentionWeights::wo}) {
    if (!(w.*member).defined() || (w.*member).numel() == 0) continue;
    held.*member = convert(w.*member, MemCategory::DenseWeights);
    values.*member = to_f32(held.*member, MemCategory::DenseWeights);
  }
  return {held, values};
}

TEST(LatentAttention, Bf16WeightsGiveTheF32ResultOfTheirValues) {
  const LatentAttentionShape s = small_shape(10);
  const auto [held, values] = held_as(random_weights(s, 16, 60), to_bf16);
  EXPECT_EQ(held.wkv_b.dtype(), DType::BF16);
  for (LatentForm form : {LatentForm::Expanded, LatentForm::Absorbed}) {
    SCOPED_TRACE(form == LatentForm::Absorbed);
    expect_cached_steps_match(s, held, values, 16, form);
  }
}

TEST(LatentAttention, Fp8BlockWeightsGiveTheF32ResultOfTheirValues) {
  // kv_lora 128 and H·(nope + v) = 128: Wkv_b is one 128 × 128 block; head 1's W_UK and both heads' W_UV
  // start inside it.
  LatentAttentionShape s;
  s.n_heads = 2;
  s.q_lora_rank = 48;
  s.kv_lora_rank = 128;
  s.qk_nope_head_dim = 32;
  s.qk_rope_head_dim = 8;
  s.v_head_dim = 32;
  s.softmax_scale = 0.3;
  const auto [held, values] = held_as(random_weights(s, 64, 70), to_fp8_blocks);
  EXPECT_EQ(held.wkv_b.dtype(), DType::F8E4M3);
  for (LatentForm form : {LatentForm::Expanded, LatentForm::Absorbed}) {
    SCOPED_TRACE(form == LatentForm::Absorbed);
    expect_cached_steps_match(s, held, values, 64, form);
  }
}

TEST(LatentAttention, RejectsBadInputNamingTheTensorAndTheRule) {
  const LatentAttentionShape s = small_shape(10);
  const int64_t d = 16;
  const Rope rope = rope_for(s, 8);
  const LatentAttentionWeights w = random_weights(s, d, 80);
  const Tensor x = randn({4, d}, 6);

  LatentAttentionWeights bad = w;
  bad.wkv_b = randn({s.kv_b_width() + 1, s.kv_lora_rank}, 7);
  expect_error([&] { latent_attention_forward(s, rope, bad, x, 1, 4, nullptr); },
               {"wkv_b", "[43, 12]", "must have shape [42, 12]"});
  bad = w;
  bad.wq = randn({s.q_width(), d}, 8);
  expect_error([&] { latent_attention_forward(s, rope, bad, x, 1, 4, nullptr); },
               {"wq is given too", "q_lora_rank=10", "either"});
  const LatentAttentionShape plain = small_shape(0);
  bad = random_weights(plain, d, 81);
  bad.wq_a = w.wq_a;
  expect_error([&] { latent_attention_forward(plain, rope, bad, x, 1, 4, nullptr); },
               {"q_lora_rank=0", "wq_a, q_a_norm or wq_b is given too"});
  bad = w;
  bad.kv_a_norm = randn({s.kv_lora_rank + 1}, 9);
  expect_error([&] { latent_attention_forward(s, rope, bad, x, 1, 4, nullptr); },
               {"kv_a_norm", "must have shape [12]"});
  LatentAttentionShape wrong = s;
  wrong.softmax_scale = 0;
  expect_error([&] { latent_attention_forward(wrong, rope, w, x, 1, 4, nullptr); },
               {"softmax_scale=0", "positive"});
  expect_error([&] { latent_attention_forward(s, Rope(6, 8), w, x, 1, 4, nullptr); },
               {"head_dim=6", "qk_rope_head_dim=4"});

  // Backward needs f32 weights.
  LatentAttentionSaved saved;
  latent_attention_forward(s, rope, w, x, 1, 4, &saved);
  LatentAttentionGrads g = zero_grads(w);
  LatentAttentionWeights held = w;
  held.wkv_b = to_bf16(w.wkv_b, MemCategory::DenseWeights);
  expect_error([&] { latent_attention_backward(s, rope, held, saved, x, g); }, {"wkv_b", "BF16", "F32"});
  g.wo = Tensor::zeros({d, s.context_width() + 1});
  expect_error([&] { latent_attention_backward(s, rope, w, saved, x, g); }, {"grads.wo", "must have shape"});

  // A cache that would overflow is refused and every cache is left as it was.
  LatentKvCache a = LatentKvCache::create(5, s), b = LatentKvCache::create(2, s);
  LatentKvCache* caches[2] = {&a, &b};
  const int64_t counts[2] = {1, 3};
  expect_error([&] { latent_attention_forward_cached(s, rope, w, x, counts, caches, LatentForm::Absorbed); },
               {"sequence 1", "adds 3", "capacity 2"});
  EXPECT_EQ(a.length, 0);
  EXPECT_EQ(b.length, 0);
  LatentKvCache* twice[2] = {&a, &a};
  const int64_t two[2] = {2, 2};
  expect_error([&] { latent_attention_forward_cached(s, rope, w, x, two, twice, LatentForm::Expanded); },
               {"appears twice"});
  expect_error(
      [&] { latent_attention_forward_cached(s, rope, w, x.rows(0, 3), two, caches, LatentForm::Expanded); },
      {"x (Σ new_tokens rows)", "[3, 16]", "[4, 16]"});
}

}  // namespace
}  // namespace expar::nn
