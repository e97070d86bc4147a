#include "expar/nn/attention_phases.hpp"

#include <algorithm>
#include <cmath>

#include "expar/core/fast_exp.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/core/weight_matmul.hpp"
#include "expar/nn/check.hpp"
#include "expar/nn/linear_products.hpp"

namespace expar::nn::phases {

namespace {

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
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

// Softmax backward of one head's rows, in place in dP [tq, tk]: dS = P ⊙ (dP - Σ_j P·dP) · scale (the
// scores were scaled). A sink is one more softmax entry with no value (its dP is 0): the keys' formula is
// unchanged, and the sink logit's gradient is p_sink·(0 - Σ_j P·dP) with p_sink = 1 - Σ_j P; returned (0
// without a sink).
double softmax_backward(const float* p, float* dp, int64_t tq, int64_t past, float scale, bool sink) {
  const int64_t tk = past + tq;
  double sink_grad = 0.0;
  for (int64_t i = 0; i < tq; ++i) {
    const float* pr = p + i * tk;
    float* dr = dp + i * tk;
    const int64_t visible = past + i + 1;
    double dot = 0.0;
    for (int64_t j = 0; j < visible; ++j) dot += static_cast<double>(pr[j]) * dr[j];
    if (sink) {
      double mass = 0.0;
      for (int64_t j = 0; j < visible; ++j) mass += pr[j];
      sink_grad -= (1.0 - mass) * dot;
    }
    const float fdot = static_cast<float>(dot);
    for (int64_t j = 0; j < visible; ++j) dr[j] = pr[j] * (dr[j] - fdot) * scale;
    for (int64_t j = visible; j < tk; ++j) dr[j] = 0.0f;
  }
  return sink_grad;
}

}  // namespace

Dims check_weights(const AttentionShape& shape, const Rope& rope, const AttentionWeights& w,
                   const char* layer) {
  shape.validate();
  EXPAR_CHECK(rope.head_dim() == shape.head_dim,
              "{}: the Rope was built for head_dim={} but the attention has head_dim={}: build them alike",
              layer, rope.head_dim(), shape.head_dim);
  EXPAR_ASSERT(w.wq.defined() && w.wq.ndim() == 2, "{}: wq has shape {}: it must be a matrix", layer,
               shape_string(w.wq.shape()));
  Dims dims{w.wq.dim(1), shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim};
  // Held as stored (inference: F32, BF16 or F16); the backward reads them as f32 and says so.
  check_weight(w.wq, layer, "wq", {dims.qd, dims.d});
  check_weight(w.wk, layer, "wk", {dims.kd, dims.d});
  check_weight(w.wv, layer, "wv", {dims.kd, dims.d});
  check_weight(w.wo, layer, "wo", {dims.d, dims.qd});
  return dims;
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

void project(const Tensor& x, const Tensor& w, float* y, bool accumulate) {
  matmul_weight(WeightProduct{
      .x = x.data<float>(), .m = x.dim(0), .w = weight_view(w), .y = y, .accumulate = accumulate});
}

void add_bias(float* y, int64_t rows, int64_t cols, const Tensor& bias) {
  if (!has(bias)) return;
  const float* b = bias.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] += b[c];
}

namespace {

// One query's scores row [tk] becomes its probabilities: softmax of scale·row over keys [lo, visible) (and
// the sink logit, when given, in the denominator), zero elsewhere.
void softmax_row(float* row, int64_t lo, int64_t visible, int64_t tk, float scale, const float* sink) {
  float max = row[lo] * scale;
  // The exact maximum in any order (not fmax: a libm call per score, and no NaN can be here).
#pragma omp simd reduction(max : max)
  for (int64_t j = lo + 1; j < visible; ++j) max = std::max(max, row[j] * scale);
  if (sink) max = std::fmax(max, *sink);
  double sum = sink ? std::exp(static_cast<double>(*sink) - max) : 0.0;
  // The vectorisable exp (core/fast_exp.hpp, within 2 ulp): scalar libm exp here was ~2 M calls per
  // layer of a 512-token prefill on one thread. The sum stays in double, in order.
#pragma omp simd
  for (int64_t j = lo; j < visible; ++j) row[j] = fast_exp(row[j] * scale - max);
  for (int64_t j = lo; j < visible; ++j) sum += row[j];
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(row, row + lo, 0.0f);
#pragma omp simd
  for (int64_t j = lo; j < visible; ++j) row[j] *= inv;
  std::fill(row + visible, row + tk, 0.0f);
}

}  // namespace

HeadWidths HeadWidths::square(int64_t head_dim) {
  return {head_dim, head_dim, static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)))};
}

void attend_head(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v, int64_t ldv,
                 int64_t tq, int64_t past, const HeadWidths& widths, float* probs, float* out, int64_t ldo,
                 int64_t window, const float* sink) {
  const int64_t tk = past + tq;
  // Query rows in blocks: block [r0, r1) sees keys [0, past + r1) only, so the products skip most of the
  // causal mask's upper triangle (a 512-token prefill computed twice the scores it needed).
  for (int64_t r0 = 0; r0 < tq; r0 += kAttentionRowBlock) {
    const int64_t r1 = std::min(tq, r0 + kAttentionRowBlock), keys = past + r1;
    float* block = probs + r0 * tk;
    matmul(MatmulArgs{.a = q + r0 * ldq,
                      .b = k,
                      .c = block,
                      .m = r1 - r0,
                      .n = keys,
                      .k = widths.qk,
                      .trans_b = true,
                      .lda = ldq,
                      .ldb = ldk,
                      .ldc = tk});  // scores q·kᵀ
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t visible = past + i + 1;
      softmax_row(probs + i * tk, window > 0 ? std::max<int64_t>(0, visible - window) : 0, visible, tk,
                  widths.scale, sink);
    }
    matmul(MatmulArgs{.a = block,
                      .b = v,
                      .c = out + r0 * ldo,
                      .m = r1 - r0,
                      .n = widths.v,
                      .k = keys,
                      .lda = tk,
                      .ldb = ldv,
                      .ldc = ldo});  // probabilities · v
  }
}

void attend_group_one_token(const float* q, int64_t group, const float* k, int64_t ldk, const float* v,
                            int64_t ldv, int64_t past, const HeadWidths& widths, float* probs, float* out,
                            int64_t window, const float* sinks) {
  const int64_t tk = past + 1;
  // The group's query heads as the rows of one product: each K and V row is read once for all of them.
  matmul(MatmulArgs{.a = q,
                    .b = k,
                    .c = probs,
                    .m = group,
                    .n = tk,
                    .k = widths.qk,
                    .trans_b = true,
                    .lda = widths.qk,
                    .ldb = ldk,
                    .ldc = tk});
  const int64_t lo = window > 0 ? std::max<int64_t>(0, tk - window) : 0;
  for (int64_t r = 0; r < group; ++r)
    softmax_row(probs + r * tk, lo, tk, tk, widths.scale, sinks ? sinks + r : nullptr);
  matmul(MatmulArgs{.a = probs,
                    .b = v,
                    .c = out,
                    .m = group,
                    .n = widths.v,
                    .k = tk,
                    .lda = tk,
                    .ldb = ldv,
                    .ldc = widths.v});
}

void check_cache_room(const char* layer, size_t i, int64_t length, int64_t adds, int64_t capacity,
                      const Rope& rope) {
  EXPAR_CHECK(length >= 0 && length + adds <= capacity,
              "{}: sequence {} holds {} cached tokens and adds {}, beyond the cache capacity {}: create the "
              "cache with a larger capacity",
              layer, i, length, adds, capacity);
  EXPAR_CHECK(length + adds <= rope.max_positions(),
              "{}: sequence {} would reach position {}, beyond the Rope's max_positions={}", layer, i,
              length + adds - 1, rope.max_positions());
}

Dims check_training_call(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const AttentionOptions& options, const char* layer) {
  const Dims dims = check_weights(shape, rope, weights, layer);
  check_options(shape, dims, options, layer);
  EXPAR_CHECK(!options.sum_squares,
              "{}: options.sum_squares completes a TP-sharded projection norm; training holds every head",
              layer);
  return dims;
}

Tensor chunk_positions(int64_t batch, int64_t seq, int64_t past) {
  Tensor positions = Tensor::empty({batch * seq}, DType::I32);
  int32_t* pos = positions.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) pos[b * seq + s] = static_cast<int32_t>(past + s);
  return positions;
}

Qkv project_qkv(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                const Dims& dims, const Tensor& x, const Tensor& positions, const AttentionOptions& options,
                AttentionSaved* saved) {
  const int64_t n = x.dim(0), hd = shape.head_dim;
  Qkv out{Tensor::empty({n, dims.qd}), Tensor::empty({n, dims.kd}), Tensor::empty({n, dims.kd})};
  const ProductRows xr = product_rows(x.data<float>(), n, dims.d, bf16_products(weights.wq_bf16));
  linear_product(xr, n, weights.wq, weights.wq_bf16, out.q.data<float>(), false);
  linear_product(xr, n, weights.wk, weights.wk_bf16, out.k.data<float>(), false);
  linear_product(xr, n, weights.wv, weights.wv_bf16, out.v.data<float>(), false);
  if (saved) saved->x = saved_operand(xr, x);
  add_bias(out.q.data<float>(), n, dims.qd, options.bq);
  add_bias(out.k.data<float>(), n, dims.kd, options.bk);
  add_bias(out.v.data<float>(), n, dims.kd, options.bv);
  if (options.qk_norm != QkNorm::None) {
    qk_norm_forward(out.q, shape.n_heads, hd, options, options.q_norm, saved ? &saved->q_norm : nullptr);
    qk_norm_forward(out.k, shape.n_kv_heads, hd, options, options.k_norm, saved ? &saved->k_norm : nullptr);
  }
  const int32_t* pos = positions.data<int32_t>();
  rope.apply(out.q.data<float>(), n, shape.n_heads, dims.qd, pos, false);
  rope.apply(out.k.data<float>(), n, shape.n_kv_heads, dims.kd, pos, false);
  return out;
}

Tensor attend(const AttendHeads& heads, const Tensor& q, const Tensor& k, const Tensor& v, int64_t batch,
              int64_t seq, int64_t past, int64_t key_rows, int64_t window, const Tensor& sinks,
              Tensor* probs) {
  const HeadWidths& w = heads.widths;
  const int64_t group = heads.n_heads / heads.n_kv_heads, tk = past + seq;
  const int64_t qd = heads.n_heads * w.qk, kd = heads.n_kv_heads * w.qk, vd = heads.n_kv_heads * w.v,
                cd = heads.n_heads * w.v;
  // Without `probs` the probabilities of one head at a time are enough.
  const bool keep = probs != nullptr;
  // Without `probs`, each compute thread keeps one head's probabilities at a time.
  const int64_t scratch = task_threads(batch * heads.n_heads);
  Tensor p_all = keep ? Tensor::empty({batch, heads.n_heads, seq, tk}) : Tensor::empty({scratch, seq, tk});
  Tensor context = Tensor::empty({batch * seq, cd});
  for_each_task(batch * heads.n_heads, [&](int64_t task, int thread) {
    const int64_t b = task / heads.n_heads, h = task % heads.n_heads, g = h / group;
    float* p = p_all.data<float>() + (keep ? task : thread) * seq * tk;
    attend_head(q.data<float>() + b * seq * qd + h * w.qk, qd, k.data<float>() + b * key_rows * kd + g * w.qk,
                kd, v.data<float>() + b * key_rows * vd + g * w.v, vd, seq, past, w, p,
                context.data<float>() + b * seq * cd + h * w.v, cd, window,
                has(sinks) ? sinks.data<float>() + h : nullptr);
  });
  if (keep) *probs = p_all;
  return context;
}

Tensor attend(const AttentionShape& shape, const Dims& dims, const Tensor& q, const Tensor& k,
              const Tensor& v, int64_t batch, int64_t seq, int64_t past, int64_t key_rows,
              const AttentionOptions& options, Tensor* probs) {
  (void)dims;  // the widths follow from the shape
  return attend(AttendHeads{shape.n_heads, shape.n_kv_heads, HeadWidths::square(shape.head_dim)}, q, k, v,
                batch, seq, past, key_rows, options.window, options.sinks, probs);
}

Tensor output_forward(const Dims& dims, const AttentionWeights& weights, const Tensor& context,
                      const AttentionOptions& options, AttentionSaved* saved) {
  const int64_t n = context.dim(0);
  Tensor y = Tensor::empty({n, dims.d});
  const ProductRows cr = product_rows(context.data<float>(), n, dims.qd, bf16_products(weights.wo_bf16));
  linear_product(cr, n, weights.wo, weights.wo_bf16, y.data<float>(), false);
  if (saved) saved->context = saved_operand(cr, context);
  add_bias(y.data<float>(), n, dims.d, options.bo);
  return y;
}

void check_backward_call(const AttentionShape& shape, const Dims& dims, const AttentionWeights& weights,
                         const AttentionSaved& saved, const Tensor& grad_y, const AttentionGrads& grads,
                         const AttentionOptions& options, const AttentionOptionGrads* option_grads,
                         const char* layer) {
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
  const int64_t batch = saved.batch, seq = saved.seq, n = batch * seq;
  EXPAR_ASSERT(saved.past >= 0 && saved.key_rows == saved.past + seq,
               "{}: saved.key_rows={} must be saved.past + saved.seq = {} + {}", layer, saved.key_rows,
               saved.past, seq);
  // The projections' input and the context as their weight gradients read them: BF16 under BF16 products.
  const bool bf16 = bf16_products(weights.wq_bf16);
  check_saved_operand(saved.x, bf16, layer, "saved.x", {n, dims.d});
  check_i32(saved.positions, layer, "saved.positions", n);
  check_f32(saved.q, layer, "saved.q", {n, dims.qd});
  check_f32(saved.k, layer, "saved.k", {batch * saved.key_rows, dims.kd});
  check_f32(saved.v, layer, "saved.v", {batch * saved.key_rows, dims.kd});
  check_f32(saved.probs, layer, "saved.probs", {batch, shape.n_heads, seq, saved.key_rows});
  check_saved_operand(saved.context, bf16, layer, "saved.context", {n, dims.qd});
  check_f32(grad_y, layer, "grad_y", {n, dims.d});
  check_f32(grads.wq, layer, "grads.wq", {dims.qd, dims.d});
  check_f32(grads.wk, layer, "grads.wk", {dims.kd, dims.d});
  check_f32(grads.wv, layer, "grads.wv", {dims.kd, dims.d});
  check_f32(grads.wo, layer, "grads.wo", {dims.d, dims.qd});
}

Tensor output_backward(const Dims& dims, const AttentionWeights& weights, const AttentionSaved& saved,
                       const Tensor& grad_y, AttentionGrads& grads, const AttentionOptions& options,
                       AttentionOptionGrads* option_grads) {
  const int64_t n = grad_y.dim(0);
  if (has(options.bo)) add_column_sums(grad_y, option_grads->bo);
  Tensor grad_context = Tensor::empty({n, dims.qd});
  const bool bf16 = bf16_products(weights.wo_bf16);
  const ProductRows gy = product_rows(grad_y.data<float>(), n, dims.d, bf16);
  linear_input_grad(gy, n, weights.wo, weights.wo_bf16, grad_context.data<float>(), false);
  linear_weight_grad(gy, saved_rows(saved.context, bf16, "attention context"), n, grads.wo);
  return grad_context;
}

QkvGrads attend_backward(const AttendHeads& heads, const Tensor& probs, const Tensor& q, const Tensor& k,
                         const Tensor& v, int64_t batch, int64_t seq, int64_t past, int64_t key_rows,
                         const Tensor& grad_context, const Tensor& sinks, Tensor* grad_sinks) {
  const HeadWidths& w = heads.widths;
  const int64_t tk = key_rows, group = heads.n_heads / heads.n_kv_heads;
  EXPAR_ASSERT(tk == past + seq, "attend_backward: key_rows={} must be past + seq = {} + {}", key_rows, past,
               seq);
  const int64_t qd = heads.n_heads * w.qk, kd = heads.n_kv_heads * w.qk, vd = heads.n_kv_heads * w.v,
                cd = heads.n_heads * w.v;
  // Query heads of one group add into the same key/value gradient in head order.
  QkvGrads g{Tensor::empty({batch * seq, qd}), Tensor::zeros({batch * tk, kd}),
             Tensor::zeros({batch * tk, vd})};
  Tensor grad_p = Tensor::empty({seq, tk});
  const bool sink = has(sinks);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads.n_heads; ++h) {
      const int64_t kv_head = h / group;
      const float* p = probs.data<float>() + (b * heads.n_heads + h) * seq * tk;
      const int64_t q_off = b * seq * qd + h * w.qk, c_off = b * seq * cd + h * w.v;
      const int64_t k_off = b * tk * kd + kv_head * w.qk, v_off = b * tk * vd + kv_head * w.v;
      float* dp = grad_p.data<float>();
      // dP = dO·vᵀ
      MatmulArgs a;
      a.a = grad_context.data<float>() + c_off;
      a.b = v.data<float>() + v_off;
      a.c = dp;
      a.m = seq, a.n = tk, a.k = w.v;
      a.trans_b = true;
      a.lda = cd, a.ldb = vd, a.ldc = tk;
      matmul(a);
      // dv += Pᵀ·dO
      MatmulArgs bv;
      bv.a = p;
      bv.b = grad_context.data<float>() + c_off;
      bv.c = g.v.data<float>() + v_off;
      bv.m = tk, bv.n = w.v, bv.k = seq;
      bv.trans_a = true, bv.accumulate = true;
      bv.lda = tk, bv.ldb = cd, bv.ldc = vd;
      matmul(bv);
      const double sink_grad = softmax_backward(p, dp, seq, past, w.scale, sink);
      if (sink) grad_sinks->data<float>()[h] += static_cast<float>(sink_grad);
      // dq = dS·k
      MatmulArgs cq;
      cq.a = dp;
      cq.b = k.data<float>() + k_off;
      cq.c = g.q.data<float>() + q_off;
      cq.m = seq, cq.n = w.qk, cq.k = tk;
      cq.lda = tk, cq.ldb = kd, cq.ldc = qd;
      matmul(cq);
      // dk += dSᵀ·q
      MatmulArgs ck;
      ck.a = dp;
      ck.b = q.data<float>() + q_off;
      ck.c = g.k.data<float>() + k_off;
      ck.m = tk, ck.n = w.qk, ck.k = seq;
      ck.trans_a = true, ck.accumulate = true;
      ck.lda = tk, ck.ldb = qd, ck.ldc = kd;
      matmul(ck);
    }
  }
  return g;
}

QkvGrads attend_backward(const AttentionShape& shape, const Dims& dims, const AttentionSaved& saved,
                         const Tensor& grad_context, const AttentionOptions& options,
                         AttentionOptionGrads* option_grads) {
  (void)dims;  // the widths follow from the shape
  return attend_backward(AttendHeads{shape.n_heads, shape.n_kv_heads, HeadWidths::square(shape.head_dim)},
                         saved.probs, saved.q, saved.k, saved.v, saved.batch, saved.seq, saved.past,
                         saved.key_rows, grad_context, options.sinks,
                         has(options.sinks) ? &option_grads->sinks : nullptr);
}

Tensor input_backward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                      const Dims& dims, const AttentionSaved& saved, Tensor grad_q, Tensor grad_k,
                      Tensor grad_v, AttentionGrads& grads, const AttentionOptions& options,
                      AttentionOptionGrads* option_grads) {
  const int64_t n = saved.batch * saved.seq, hd = shape.head_dim;
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

  Tensor grad_x = Tensor::empty({n, dims.d});
  float* gx = grad_x.data<float>();
  const bool bf16 = bf16_products(weights.wq_bf16);
  const ProductRows gq = product_rows(grad_q.data<float>(), n, dims.qd, bf16);
  const ProductRows gk = product_rows(grad_k.data<float>(), n, dims.kd, bf16);
  const ProductRows gv = product_rows(grad_v.data<float>(), n, dims.kd, bf16);
  linear_input_grad(gq, n, weights.wq, weights.wq_bf16, gx, false);
  linear_input_grad(gk, n, weights.wk, weights.wk_bf16, gx, true);
  linear_input_grad(gv, n, weights.wv, weights.wv_bf16, gx, true);
  const ProductRows px = saved_rows(saved.x, bf16, "attention input");
  linear_weight_grad(gq, px, n, grads.wq);
  linear_weight_grad(gk, px, n, grads.wk);
  linear_weight_grad(gv, px, n, grads.wv);
  return grad_x;
}

}  // namespace expar::nn::phases
