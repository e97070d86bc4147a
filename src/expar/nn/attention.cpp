#include "expar/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "expar/core/fast_exp.hpp"
#include "expar/core/matmul.hpp"
#include "expar/nn/check.hpp"
#include "expar/nn/qk_norm.hpp"

namespace expar::nn {

void AttentionShape::validate() const {
  EXPAR_CHECK(n_heads > 0 && n_kv_heads > 0 && head_dim > 0,
              "attention: n_heads={} n_kv_heads={} head_dim={}: all must be positive", n_heads, n_kv_heads,
              head_dim);
  EXPAR_CHECK(
      n_heads % n_kv_heads == 0,
      "attention: n_heads={} is not a multiple of n_kv_heads={}: each key/value head serves a whole group "
      "of query heads; choose n_kv_heads dividing n_heads",
      n_heads, n_kv_heads);
}

namespace {

struct Dims {
  int64_t d;   // model width
  int64_t qd;  // n_heads·head_dim
  int64_t kd;  // n_kv_heads·head_dim
};

Dims check_weights(const AttentionShape& shape, const Rope& rope, const AttentionWeights& w,
                   const char* layer) {
  shape.validate();
  EXPAR_CHECK(rope.head_dim() == shape.head_dim,
              "{}: the Rope was built for head_dim={} but the attention has head_dim={}: build them alike",
              layer, rope.head_dim(), shape.head_dim);
  check_f32_matrix(w.wq, layer, "wq");
  Dims dims{w.wq.dim(1), shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim};
  check_f32(w.wq, layer, "wq", {dims.qd, dims.d});
  check_f32(w.wk, layer, "wk", {dims.kd, dims.d});
  check_f32(w.wv, layer, "wv", {dims.kd, dims.d});
  check_f32(w.wo, layer, "wo", {dims.d, dims.qd});
  return dims;
}

// y [n, out] = x [n, in] · wᵀ (w [out, in]).
void project(const Tensor& x, const Tensor& w, float* y, bool accumulate) {
  matmul(x.data<float>(), w.data<float>(), y, x.dim(0), w.dim(0), w.dim(1), false, true, accumulate);
}

// One head: tq queries at positions [past, past + tq) against tk = past + tq keys; query i sees keys
// [lo_i, past + i] with lo_i = 0, or past + i - window + 1 with a window. `sink` (nullable) is one extra
// logit in the softmax denominator. Writes probs [tq, tk] (zero where masked) and out [tq, head_dim] (row
// stride ldo).
void attend_head(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv, int64_t tq,
                 int64_t past, int64_t head_dim, float* probs, float* out, int64_t ldo, int64_t window = 0,
                 const float* sink = nullptr) {
  const int64_t tk = past + tq;
  MatmulArgs scores;
  scores.a = q;
  scores.b = k;
  scores.c = probs;
  scores.m = tq;
  scores.n = tk;
  scores.k = head_dim;
  scores.trans_b = true;
  scores.lda = ldq;
  scores.ldb = ldkv;
  scores.ldc = tk;
  matmul(scores);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  for (int64_t i = 0; i < tq; ++i) {
    float* row = probs + i * tk;
    const int64_t visible = past + i + 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, visible - window) : 0;
    float max = row[lo] * scale;
    for (int64_t j = lo + 1; j < visible; ++j) max = std::fmax(max, row[j] * scale);
    if (sink) max = std::fmax(max, *sink);
    double sum = sink ? std::exp(static_cast<double>(*sink) - max) : 0.0;
    // The vectorisable exp (core/fast_exp.hpp, within 2 ulp): scalar libm exp here was ~2 M calls per
    // layer of a 512-token prefill on one thread. The sum stays in double, in order.
#pragma omp simd
    for (int64_t j = lo; j < visible; ++j) row[j] = fast_exp(row[j] * scale - max);
    for (int64_t j = lo; j < visible; ++j) sum += row[j];
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
    for (int64_t j = lo; j < visible; ++j) row[j] *= inv;
    for (int64_t j = visible; j < tk; ++j) row[j] = 0.0f;
  }
  MatmulArgs weighted;
  weighted.a = probs;
  weighted.b = v;
  weighted.c = out;
  weighted.m = tq;
  weighted.n = head_dim;
  weighted.k = tk;
  weighted.lda = tk;
  weighted.ldb = ldkv;
  weighted.ldc = ldo;
  matmul(weighted);
}

// Adds bias [cols] (when present) to every row of y [rows, cols].
void add_bias(float* y, int64_t rows, int64_t cols, const Tensor& bias) {
  if (!bias.defined() || bias.numel() == 0) return;
  const float* b = bias.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += b[c];
}

void check_options(const AttentionShape& shape, const Dims& dims, const AttentionOptions& o,
                   const char* layer) {
  auto check_vector = [&](const Tensor& t, const char* what, int64_t n) {
    if (t.defined() && t.numel() > 0) check_f32(t, layer, what, {n});
  };
  check_vector(o.bq, "options.bq", dims.qd);
  check_vector(o.bk, "options.bk", dims.kd);
  check_vector(o.bv, "options.bv", dims.kd);
  check_vector(o.bo, "options.bo", dims.d);
  check_vector(o.sinks, "options.sinks", shape.n_heads);
  if (o.qk_norm != QkNorm::None) {
    const bool per_head = o.qk_norm == QkNorm::PerHead;
    check_f32(o.q_norm, layer, "options.q_norm", {per_head ? shape.head_dim : dims.qd});
    check_f32(o.k_norm, layer, "options.k_norm", {per_head ? shape.head_dim : dims.kd});
    EXPAR_CHECK(o.qk_norm_eps > 0.0f, "{}: options.qk_norm_eps={} must be positive", layer, o.qk_norm_eps);
  }
  EXPAR_CHECK(o.window >= 0, "{}: options.window={} must not be negative (0: no sliding window)", layer,
              o.window);
}

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

// The training functions take every option except the inference-only ones.
void check_training_options(const AttentionShape& shape, const Dims& dims, const AttentionOptions& o,
                            const char* layer) {
  check_options(shape, dims, o, layer);
  EXPAR_CHECK(!o.sum_squares,
              "{}: options.sum_squares completes a TP-sharded projection norm; training holds every head",
              layer);
}

// The q/k RMSNorm of `options` as a row RMSNorm: per head over rows of head_dim values, or over the whole
// projection; `t` [n, width] is replaced by its normalised copy and its input and 1/rms saved (if `saved`).
void qk_norm_forward(Tensor& t, int64_t heads, int64_t head_dim, const AttentionOptions& o,
                     const Tensor& gain, RmsNormSaved* saved) {
  const int64_t n = t.dim(0), width = t.dim(1);
  const bool per_head = o.qk_norm == QkNorm::PerHead;
  Tensor rows = per_head ? t.reshape({n * heads, head_dim}) : t;
  t = rmsnorm_forward(rows, gain, o.qk_norm_eps, saved).reshape({n, width});
}

void qk_norm_backward(Tensor& grad, int64_t heads, int64_t head_dim, const AttentionOptions& o,
                      const Tensor& gain, const RmsNormSaved& saved, Tensor& grad_gain) {
  const int64_t n = grad.dim(0), width = grad.dim(1);
  const bool per_head = o.qk_norm == QkNorm::PerHead;
  Tensor rows = per_head ? grad.reshape({n * heads, head_dim}) : grad;
  grad = rmsnorm_backward(saved, rows, gain, grad_gain).reshape({n, width});
}

// grad_bias [cols] += Σ_rows g [rows, cols].
void add_column_sums(const Tensor& g, Tensor& grad_bias) {
  const int64_t rows = g.dim(0), cols = g.dim(1);
  const float* pg = g.data<float>();
  float* pb = grad_bias.data<float>();
  for (int64_t c = 0; c < cols; ++c) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += pg[r * cols + c];
    pb[c] += static_cast<float>(acc);
  }
}

}  // namespace

Tensor attention_forward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const Tensor& x, int64_t batch, int64_t seq, AttentionSaved* saved,
                         const AttentionOptions& options) {
  const Dims dims = check_weights(shape, rope, weights, "attention_forward");
  check_training_options(shape, dims, options, "attention_forward");
  EXPAR_CHECK(batch >= 0 && seq >= 0, "attention_forward: batch={} seq={} must not be negative", batch, seq);
  const int64_t n = batch * seq, hd = shape.head_dim, group = shape.n_heads / shape.n_kv_heads;
  check_f32(x, "attention_forward", "x (batch·seq rows)", {n, dims.d});
  EXPAR_CHECK(seq <= rope.max_positions(),
              "attention_forward: seq={} exceeds the Rope's max_positions={}: build the Rope for the longest "
              "sequence",
              seq, rope.max_positions());

  Tensor positions = Tensor::empty({n}, DType::I32);
  int32_t* pos = positions.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) pos[b * seq + s] = static_cast<int32_t>(s);

  Tensor q = Tensor::empty({n, dims.qd}), k = Tensor::empty({n, dims.kd}), v = Tensor::empty({n, dims.kd});
  project(x, weights.wq, q.data<float>(), false);
  project(x, weights.wk, k.data<float>(), false);
  project(x, weights.wv, v.data<float>(), false);
  add_bias(q.data<float>(), n, dims.qd, options.bq);
  add_bias(k.data<float>(), n, dims.kd, options.bk);
  add_bias(v.data<float>(), n, dims.kd, options.bv);
  if (options.qk_norm != QkNorm::None) {
    qk_norm_forward(q, shape.n_heads, hd, options, options.q_norm, saved ? &saved->q_norm : nullptr);
    qk_norm_forward(k, shape.n_kv_heads, hd, options, options.k_norm, saved ? &saved->k_norm : nullptr);
  }
  rope.apply(q.data<float>(), n, shape.n_heads, dims.qd, pos, false);
  rope.apply(k.data<float>(), n, shape.n_kv_heads, dims.kd, pos, false);

  // Without `saved` the probabilities of one head at a time are enough.
  Tensor probs = saved ? Tensor::empty({batch, shape.n_heads, seq, seq}) : Tensor::empty({seq, seq});
  Tensor context = Tensor::empty({n, dims.qd});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t g = h / group;
      float* p = probs.data<float>() + (saved ? (b * shape.n_heads + h) * seq * seq : 0);
      attend_head(q.data<float>() + b * seq * dims.qd + h * hd, dims.qd,
                  k.data<float>() + b * seq * dims.kd + g * hd, v.data<float>() + b * seq * dims.kd + g * hd,
                  dims.kd, seq, 0, hd, p, context.data<float>() + b * seq * dims.qd + h * hd, dims.qd,
                  options.window, has(options.sinks) ? options.sinks.data<float>() + h : nullptr);
    }
  }
  Tensor y = Tensor::empty({n, dims.d});
  project(context, weights.wo, y.data<float>(), false);
  add_bias(y.data<float>(), n, dims.d, options.bo);
  if (saved) {
    saved->batch = batch;
    saved->seq = seq;
    saved->x = x;
    saved->positions = positions;
    saved->q = q;
    saved->k = k;
    saved->v = v;
    saved->probs = probs;
    saved->context = context;
  }
  return y;
}

Tensor attention_backward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                          const AttentionSaved& saved, const Tensor& grad_y, AttentionGrads& grads,
                          const AttentionOptions& options, AttentionOptionGrads* option_grads) {
  const char* layer = "attention_backward";
  const Dims dims = check_weights(shape, rope, weights, layer);
  check_training_options(shape, dims, options, layer);
  const bool with_params = has(options.bq) || has(options.bk) || has(options.bv) || has(options.bo) ||
                           has(options.sinks) || options.qk_norm != QkNorm::None;
  EXPAR_CHECK(!with_params || option_grads != nullptr,
              "{}: the options have biases or q/k norms but no option_grads was passed for their gradients",
              layer);
  auto check_grad = [&](const Tensor& param, const Tensor& grad, const char* what) {
    if (has(param)) check_f32(grad, layer, what, param.shape());
  };
  if (option_grads) {
    check_grad(options.bq, option_grads->bq, "option_grads.bq");
    check_grad(options.bk, option_grads->bk, "option_grads.bk");
    check_grad(options.bv, option_grads->bv, "option_grads.bv");
    check_grad(options.bo, option_grads->bo, "option_grads.bo");
    check_grad(options.sinks, option_grads->sinks, "option_grads.sinks");
    if (options.qk_norm != QkNorm::None) {
      check_grad(options.q_norm, option_grads->q_norm, "option_grads.q_norm");
      check_grad(options.k_norm, option_grads->k_norm, "option_grads.k_norm");
    }
  }
  const int64_t batch = saved.batch, seq = saved.seq, n = batch * seq, hd = shape.head_dim;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  check_f32(saved.x, layer, "saved.x", {n, dims.d});
  check_i32(saved.positions, layer, "saved.positions", n);
  check_f32(saved.q, layer, "saved.q", {n, dims.qd});
  check_f32(saved.k, layer, "saved.k", {n, dims.kd});
  check_f32(saved.v, layer, "saved.v", {n, dims.kd});
  check_f32(saved.probs, layer, "saved.probs", {batch, shape.n_heads, seq, seq});
  check_f32(saved.context, layer, "saved.context", {n, dims.qd});
  check_f32(grad_y, layer, "grad_y", {n, dims.d});
  check_f32(grads.wq, layer, "grads.wq", {dims.qd, dims.d});
  check_f32(grads.wk, layer, "grads.wk", {dims.kd, dims.d});
  check_f32(grads.wv, layer, "grads.wv", {dims.kd, dims.d});
  check_f32(grads.wo, layer, "grads.wo", {dims.d, dims.qd});

  if (has(options.bo)) add_column_sums(grad_y, option_grads->bo);
  // Output projection.
  Tensor grad_context = Tensor::empty({n, dims.qd});
  matmul(grad_y.data<float>(), weights.wo.data<float>(), grad_context.data<float>(), n, dims.qd, dims.d,
         false, false, false);
  matmul(grad_y.data<float>(), saved.context.data<float>(), grads.wo.data<float>(), dims.d, dims.qd, n, true,
         false, true);

  // Per (sequence, head). Query heads of one group add into the same key/value gradient in head order.
  Tensor grad_q = Tensor::empty({n, dims.qd});
  Tensor grad_k = Tensor::zeros({n, dims.kd}), grad_v = Tensor::zeros({n, dims.kd});
  Tensor grad_p = Tensor::empty({seq, seq});
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t g = h / group;
      const float* p = saved.probs.data<float>() + (b * shape.n_heads + h) * seq * seq;
      const int64_t q_off = b * seq * dims.qd + h * hd, kv_off = b * seq * dims.kd + g * hd;
      float* dp = grad_p.data<float>();
      // dP = dO·vᵀ
      MatmulArgs a;
      a.a = grad_context.data<float>() + q_off;
      a.b = saved.v.data<float>() + kv_off;
      a.c = dp;
      a.m = seq, a.n = seq, a.k = hd;
      a.trans_b = true;
      a.lda = dims.qd, a.ldb = dims.kd, a.ldc = seq;
      matmul(a);
      // dv += Pᵀ·dO
      MatmulArgs bv;
      bv.a = p;
      bv.b = grad_context.data<float>() + q_off;
      bv.c = grad_v.data<float>() + kv_off;
      bv.m = seq, bv.n = hd, bv.k = seq;
      bv.trans_a = true, bv.accumulate = true;
      bv.lda = seq, bv.ldb = dims.qd, bv.ldc = dims.kd;
      matmul(bv);
      // Softmax backward, in place in dP: dS = P ⊙ (dP - Σ_j P·dP) · scale (the scores were scaled). A sink
      // is one more softmax entry with no value (its dP is 0): the keys' formula is unchanged, and the sink
      // logit's gradient is p_sink·(0 - Σ_j P·dP) with p_sink = 1 - Σ_j P.
      const bool sink = has(options.sinks);
      double sink_grad = 0.0;
      for (int64_t i = 0; i < seq; ++i) {
        const float* pr = p + i * seq;
        float* dr = dp + i * seq;
        double dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * dr[j];
        if (sink) {
          double mass = 0.0;
          for (int64_t j = 0; j <= i; ++j) mass += pr[j];
          sink_grad -= (1.0 - mass) * dot;
        }
        const float fdot = static_cast<float>(dot);
        for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - fdot) * scale;
        for (int64_t j = i + 1; j < seq; ++j) dr[j] = 0.0f;
      }
      if (sink) option_grads->sinks.data<float>()[h] += static_cast<float>(sink_grad);
      // dq = dS·k
      MatmulArgs cq;
      cq.a = dp;
      cq.b = saved.k.data<float>() + kv_off;
      cq.c = grad_q.data<float>() + q_off;
      cq.m = seq, cq.n = hd, cq.k = seq;
      cq.lda = seq, cq.ldb = dims.kd, cq.ldc = dims.qd;
      matmul(cq);
      // dk += dSᵀ·q
      MatmulArgs ck;
      ck.a = dp;
      ck.b = saved.q.data<float>() + q_off;
      ck.c = grad_k.data<float>() + kv_off;
      ck.m = seq, ck.n = hd, ck.k = seq;
      ck.trans_a = true, ck.accumulate = true;
      ck.lda = seq, ck.ldb = dims.qd, ck.ldc = dims.kd;
      matmul(ck);
    }
  }
  const int32_t* pos = saved.positions.data<int32_t>();
  rope.apply(grad_q.data<float>(), n, shape.n_heads, dims.qd, pos, true);
  rope.apply(grad_k.data<float>(), n, shape.n_kv_heads, dims.kd, pos, true);
  if (options.qk_norm != QkNorm::None) {
    qk_norm_backward(grad_q, shape.n_heads, hd, options, options.q_norm, saved.q_norm, option_grads->q_norm);
    qk_norm_backward(grad_k, shape.n_kv_heads, hd, options, options.k_norm, saved.k_norm,
                     option_grads->k_norm);
  }
  if (has(options.bq)) add_column_sums(grad_q, option_grads->bq);
  if (has(options.bk)) add_column_sums(grad_k, option_grads->bk);
  if (has(options.bv)) add_column_sums(grad_v, option_grads->bv);

  // Input projections.
  Tensor grad_x = Tensor::empty({n, dims.d});
  float* gx = grad_x.data<float>();
  matmul(grad_q.data<float>(), weights.wq.data<float>(), gx, n, dims.d, dims.qd, false, false, false);
  matmul(grad_k.data<float>(), weights.wk.data<float>(), gx, n, dims.d, dims.kd, false, false, true);
  matmul(grad_v.data<float>(), weights.wv.data<float>(), gx, n, dims.d, dims.kd, false, false, true);
  const float* px = saved.x.data<float>();
  matmul(grad_q.data<float>(), px, grads.wq.data<float>(), dims.qd, dims.d, n, true, false, true);
  matmul(grad_k.data<float>(), px, grads.wk.data<float>(), dims.kd, dims.d, n, true, false, true);
  matmul(grad_v.data<float>(), px, grads.wv.data<float>(), dims.kd, dims.d, n, true, false, true);
  return grad_x;
}

KvCache KvCache::create(int64_t capacity, const AttentionShape& shape) {
  shape.validate();
  EXPAR_CHECK(capacity >= 0, "KvCache::create: capacity={} must not be negative", capacity);
  KvCache cache;
  cache.k = Tensor::empty({capacity, shape.n_kv_heads * shape.head_dim}, DType::F32, MemCategory::KvCache);
  cache.v = Tensor::empty({capacity, shape.n_kv_heads * shape.head_dim}, DType::F32, MemCategory::KvCache);
  return cache;
}

Tensor attention_forward_cached(const AttentionShape& shape, const Rope& rope,
                                const AttentionWeights& weights, const Tensor& x,
                                std::span<const int64_t> new_tokens, std::span<KvCache* const> caches,
                                const AttentionOptions& options) {
  const char* layer = "attention_forward_cached";
  const Dims dims = check_weights(shape, rope, weights, layer);
  check_options(shape, dims, options, layer);
  const int64_t hd = shape.head_dim, group = shape.n_heads / shape.n_kv_heads;
  EXPAR_CHECK(new_tokens.size() == caches.size(),
              "{}: {} token counts for {} caches: pass one count and one cache per sequence", layer,
              new_tokens.size(), caches.size());
  // Validate everything before any cache is touched, so a bad call leaves the caches as they were.
  int64_t total = 0, longest = 0;
  std::unordered_set<const KvCache*> seen;
  for (size_t i = 0; i < caches.size(); ++i) {
    const KvCache* c = caches[i];
    EXPAR_CHECK(c != nullptr, "{}: cache {} is null: pass one cache per sequence", layer, i);
    EXPAR_CHECK(seen.insert(c).second, "{}: cache {} appears twice: each sequence needs its own cache", layer,
                i);
    EXPAR_CHECK(new_tokens[i] >= 0, "{}: new_tokens[{}]={} must not be negative", layer, i, new_tokens[i]);
    check_f32_matrix(c->k, layer, "cache.k");
    const int64_t capacity = c->k.dim(0);
    check_f32(c->k, layer, "cache.k", {capacity, dims.kd});
    check_f32(c->v, layer, "cache.v", {capacity, dims.kd});
    EXPAR_CHECK(
        c->length >= 0 && c->length + new_tokens[i] <= capacity,
        "{}: sequence {} holds {} cached tokens and adds {}, beyond the cache capacity {}: create the "
        "cache with a larger capacity",
        layer, i, c->length, new_tokens[i], capacity);
    EXPAR_CHECK(c->length + new_tokens[i] <= rope.max_positions(),
                "{}: sequence {} would reach position {}, beyond the Rope's max_positions={}", layer, i,
                c->length + new_tokens[i] - 1, rope.max_positions());
    total += new_tokens[i];
    longest = std::max(longest, new_tokens[i] * (c->length + new_tokens[i]));
  }
  check_f32(x, layer, "x (Σ new_tokens rows)", {total, dims.d});

  Tensor positions = Tensor::empty({total}, DType::I32);
  int32_t* pos = positions.data<int32_t>();
  for (size_t i = 0, row = 0; i < caches.size(); ++i)
    for (int64_t t = 0; t < new_tokens[i]; ++t) pos[row++] = static_cast<int32_t>(caches[i]->length + t);

  Tensor q = Tensor::empty({total, dims.qd}), k = Tensor::empty({total, dims.kd}),
         v = Tensor::empty({total, dims.kd});
  project(x, weights.wq, q.data<float>(), false);
  project(x, weights.wk, k.data<float>(), false);
  project(x, weights.wv, v.data<float>(), false);
  add_bias(q.data<float>(), total, dims.qd, options.bq);
  add_bias(k.data<float>(), total, dims.kd, options.bk);
  add_bias(v.data<float>(), total, dims.kd, options.bv);
  apply_qk_norm(shape, options, q.data<float>(), k.data<float>(), total);
  rope.apply(q.data<float>(), total, shape.n_heads, dims.qd, pos, false);
  rope.apply(k.data<float>(), total, shape.n_kv_heads, dims.kd, pos, false);

  Tensor probs = Tensor::empty({longest});
  Tensor context = Tensor::empty({total, dims.qd});
  int64_t row0 = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    KvCache& c = *caches[i];
    const int64_t tq = new_tokens[i], past = c.length;
    const size_t row_bytes = sizeof(float) * static_cast<size_t>(dims.kd);
    if (tq > 0) {
      std::memcpy(c.k.data<float>() + past * dims.kd, k.data<float>() + row0 * dims.kd,
                  row_bytes * static_cast<size_t>(tq));
      std::memcpy(c.v.data<float>() + past * dims.kd, v.data<float>() + row0 * dims.kd,
                  row_bytes * static_cast<size_t>(tq));
    }
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const int64_t g = h / group;
      attend_head(
          q.data<float>() + row0 * dims.qd + h * hd, dims.qd, c.k.data<float>() + g * hd,
          c.v.data<float>() + g * hd, dims.kd, tq, past, hd, probs.data<float>(),
          context.data<float>() + row0 * dims.qd + h * hd, dims.qd, options.window,
          options.sinks.defined() && options.sinks.numel() > 0 ? options.sinks.data<float>() + h : nullptr);
    }
    c.length += tq;
    row0 += tq;
  }
  Tensor y = Tensor::empty({total, dims.d});
  project(context, weights.wo, y.data<float>(), false);
  add_bias(y.data<float>(), total, dims.d, options.bo);
  return y;
}

}  // namespace expar::nn
