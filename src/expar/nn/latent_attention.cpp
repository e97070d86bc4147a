#include "expar/nn/latent_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/core/weight_matmul.hpp"
#include "expar/nn/attention_phases.hpp"
#include "expar/nn/check.hpp"
#include "expar/nn/latent_attention_phases.hpp"

namespace expar::nn {

void LatentAttentionShape::validate() const {
  EXPAR_CHECK(n_heads > 0, "latent attention: n_heads={} must be positive", n_heads);
  EXPAR_CHECK(q_lora_rank >= 0,
              "latent attention: q_lora_rank={} must not be negative (0: q = x·Wqᵀ without the low-rank "
              "projection)",
              q_lora_rank);
  EXPAR_CHECK(kv_lora_rank > 0 && qk_nope_head_dim > 0 && v_head_dim > 0,
              "latent attention: kv_lora_rank={} qk_nope_head_dim={} v_head_dim={}: all must be positive",
              kv_lora_rank, qk_nope_head_dim, v_head_dim);
  EXPAR_CHECK(qk_rope_head_dim > 0 && qk_rope_head_dim % 2 == 0,
              "latent attention: qk_rope_head_dim={} must be positive and even (RoPE rotates pairs)",
              qk_rope_head_dim);
  EXPAR_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0.0,
              "latent attention: softmax_scale={} must be finite and positive (DeepSeek: (nope + rope)^-0.5 "
              "times mscale²)",
              softmax_scale);
  EXPAR_CHECK(std::isfinite(norm_eps) && norm_eps > 0.0f,
              "latent attention: norm_eps={} must be finite and positive (DeepSeek: 1e-6)", norm_eps);
}

namespace {

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

phases::AttendHeads heads_of(const LatentAttentionShape& s) {
  return {s.n_heads, s.n_heads,
          phases::HeadWidths{s.qk_head_dim(), s.v_head_dim, static_cast<float>(s.softmax_scale)}};
}

// RoPE (or its inverse) on every head's rope part of q [n, H·(nope+rope)].
void rotate_query_ropes(const LatentAttentionShape& s, const Rope& rope, float* q, int64_t n,
                        const int32_t* positions, bool inverse) {
  for (int64_t h = 0; h < s.n_heads; ++h)
    rope.apply(q + h * s.qk_head_dim() + s.qk_nope_head_dim, n, 1, s.q_width(), positions, inverse);
}

}  // namespace

namespace latent_phases {

int64_t check_weights(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                      const char* layer) {
  s.validate();
  EXPAR_CHECK(rope.head_dim() == s.qk_rope_head_dim,
              "{}: the Rope was built for head_dim={} but qk_rope_head_dim={}: build it for the rope part",
              layer, rope.head_dim(), s.qk_rope_head_dim);
  EXPAR_CHECK(w.wkv_a.defined() && w.wkv_a.ndim() == 2,
              "{}: wkv_a has shape {}: it must be the matrix [kv_lora_rank + qk_rope_head_dim, d] = [{}, d]",
              layer, shape_string(w.wkv_a.shape()), s.kv_a_width());
  const int64_t d = w.wkv_a.dim(1);
  check_weight(w.wkv_a, layer, "wkv_a", {s.kv_a_width(), d});
  check_f32(w.kv_a_norm, layer, "kv_a_norm", {s.kv_lora_rank});
  check_weight(w.wkv_b, layer, "wkv_b", {s.kv_b_width(), s.kv_lora_rank});
  check_weight(w.wo, layer, "wo", {d, s.context_width()});
  if (s.q_lora_rank == 0) {
    EXPAR_CHECK(!has(w.wq_a) && !has(w.q_a_norm) && !has(w.wq_b),
                "{}: q_lora_rank=0 takes q = x·Wqᵀ from wq alone, but wq_a, q_a_norm or wq_b is given too: "
                "pass either wq, or wq_a, q_a_norm and wq_b with q_lora_rank > 0",
                layer);
    check_weight(w.wq, layer, "wq", {s.q_width(), d});
  } else {
    EXPAR_CHECK(
        !has(w.wq),
        "{}: q_lora_rank={} takes q through wq_a, q_a_norm and wq_b, but wq is given too: pass either "
        "wq (q_lora_rank 0) or the three",
        layer, s.q_lora_rank);
    check_weight(w.wq_a, layer, "wq_a", {s.q_lora_rank, d});
    check_f32(w.q_a_norm, layer, "q_a_norm", {s.q_lora_rank});
    check_weight(w.wq_b, layer, "wq_b", {s.q_width(), s.q_lora_rank});
  }
  return d;
}

void check_backward_call(const LatentAttentionShape& shape, const LatentAttentionWeights& weights,
                         const LatentAttentionSaved& saved, const Tensor& grad_y,
                         const LatentAttentionGrads& grads, int64_t d, const char* layer) {
  // The backward multiplies the weights as f32 matrices, and adds into f32 gradients of their shapes.
  auto check_f32_weight = [&](const Tensor& wt, const Tensor& g, const char* what, const char* grad_what) {
    check_f32(wt, layer, what, wt.shape());
    check_f32(g, layer, grad_what, wt.shape());
  };
  const bool low_rank_q = shape.q_lora_rank > 0;
  if (low_rank_q) {
    check_f32_weight(weights.wq_a, grads.wq_a, "wq_a", "grads.wq_a");
    check_f32_weight(weights.q_a_norm, grads.q_a_norm, "q_a_norm", "grads.q_a_norm");
    check_f32_weight(weights.wq_b, grads.wq_b, "wq_b", "grads.wq_b");
  } else {
    check_f32_weight(weights.wq, grads.wq, "wq", "grads.wq");
  }
  check_f32_weight(weights.wkv_a, grads.wkv_a, "wkv_a", "grads.wkv_a");
  check_f32_weight(weights.kv_a_norm, grads.kv_a_norm, "kv_a_norm", "grads.kv_a_norm");
  check_f32_weight(weights.wkv_b, grads.wkv_b, "wkv_b", "grads.wkv_b");
  check_f32_weight(weights.wo, grads.wo, "wo", "grads.wo");

  const int64_t batch = saved.batch, seq = saved.seq, n = batch * seq, key_rows = saved.key_rows;
  EXPAR_CHECK(batch >= 0 && seq >= 0 && saved.past >= 0 && key_rows == saved.past + seq,
              "{}: saved.batch={} saved.seq={} saved.past={} saved.key_rows={}: pass what the forward saved",
              layer, batch, seq, saved.past, key_rows);
  const int64_t qd = shape.q_width(), cd = shape.context_width(), keys = batch * key_rows;
  check_f32(saved.x, layer, "saved.x", {n, d});
  check_i32(saved.positions, layer, "saved.positions", n);
  if (low_rank_q) check_f32(saved.q_a, layer, "saved.q_a", {n, shape.q_lora_rank});
  check_f32(saved.latent, layer, "saved.latent", {keys, shape.kv_a_width()});
  check_f32(saved.q, layer, "saved.q", {n, qd});
  check_f32(saved.k, layer, "saved.k", {keys, qd});
  check_f32(saved.v, layer, "saved.v", {keys, cd});
  check_f32(saved.probs, layer, "saved.probs", {batch, shape.n_heads, seq, key_rows});
  check_f32(saved.context, layer, "saved.context", {n, cd});
  check_f32(grad_y, layer, "grad_y", {n, d});
}

Tensor project_queries(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                       const Tensor& x, const int32_t* positions, LatentAttentionSaved* saved) {
  const int64_t n = x.dim(0);
  Tensor q = Tensor::empty({n, s.q_width()});
  if (s.q_lora_rank == 0) {
    phases::project(x, w.wq, q.data<float>(), false);
  } else {
    Tensor q_a = Tensor::empty({n, s.q_lora_rank});
    phases::project(x, w.wq_a, q_a.data<float>(), false);
    Tensor q_a_n = rmsnorm_forward(q_a, w.q_a_norm, s.norm_eps, saved ? &saved->q_norm : nullptr);
    phases::project(q_a_n, w.wq_b, q.data<float>(), false);
    if (saved) saved->q_a = q_a_n;
  }
  rotate_query_ropes(s, rope, q.data<float>(), n, positions, false);
  return q;
}

Tensor project_latents(const LatentAttentionShape& s, const Rope& rope, const LatentAttentionWeights& w,
                       const Tensor& x, const int32_t* positions, RmsNormSaved* norm) {
  const int64_t n = x.dim(0), r = s.kv_lora_rank, width = s.kv_a_width();
  Tensor latent = Tensor::empty({n, width});
  float* pl = latent.data<float>();
  phases::project(x, w.wkv_a, pl, false);
  Tensor c = Tensor::empty({n, r});
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(c.data<float>() + i * r, pl + i * width, sizeof(float) * static_cast<size_t>(r));
  Tensor c_n = rmsnorm_forward(c, w.kv_a_norm, s.norm_eps, norm);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(pl + i * width, c_n.data<float>() + i * r, sizeof(float) * static_cast<size_t>(r));
  rope.apply(pl + r, n, 1, width, positions, false);
  return latent;
}

void expand_keys_values(const LatentAttentionShape& s, const Tensor& wkv_b, const float* latent, int64_t ld,
                        int64_t rows, float* k, float* v) {
  const int64_t nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim, vd = s.v_head_dim, qk = s.qk_head_dim(),
                kvb = s.kv_b_width();
  Tensor kv = Tensor::empty({rows, kvb});
  matmul_weight(
      WeightProduct{.x = latent, .m = rows, .ldx = ld, .w = weight_view(wkv_b), .y = kv.data<float>()});
  const float* pkv = kv.data<float>();
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const float* src = pkv + j * kvb + h * (nope + vd);
      float* kh = k + j * s.q_width() + h * qk;
      std::memcpy(kh, src, sizeof(float) * static_cast<size_t>(nope));
      std::memcpy(kh + nope, latent + j * ld + s.kv_lora_rank, sizeof(float) * static_cast<size_t>(rope));
      std::memcpy(v + j * s.context_width() + h * vd, src + nope, sizeof(float) * static_cast<size_t>(vd));
    }
}

Tensor attend_latents(const LatentAttentionShape& s, const LatentAttentionWeights& w, const Tensor& q,
                      const Tensor& latent, int64_t batch, int64_t seq, int64_t past,
                      LatentAttentionSaved* saved) {
  const int64_t key_rows = past + seq, keys = batch * key_rows, d = w.wo.dim(0);
  Tensor k = Tensor::empty({keys, s.q_width()}), v = Tensor::empty({keys, s.context_width()});
  expand_keys_values(s, w.wkv_b, latent.data<float>(), s.kv_a_width(), keys, k.data<float>(),
                     v.data<float>());
  Tensor probs;
  Tensor context =
      phases::attend(heads_of(s), q, k, v, batch, seq, past, key_rows, 0, Tensor{}, saved ? &probs : nullptr);
  Tensor y = Tensor::empty({batch * seq, d});
  phases::project(context, w.wo, y.data<float>(), false);
  if (saved) {
    saved->batch = batch;
    saved->seq = seq;
    saved->past = past;
    saved->key_rows = key_rows;
    saved->q = q;
    saved->latent = latent;
    saved->k = k;
    saved->v = v;
    saved->probs = probs;
    saved->context = context;
  }
  return y;
}

LatentRowGrads attend_latents_backward(const LatentAttentionShape& shape,
                                       const LatentAttentionWeights& weights,
                                       const LatentAttentionSaved& saved, const Tensor& grad_y,
                                       LatentAttentionGrads& grads) {
  const int64_t batch = saved.batch, seq = saved.seq, n = batch * seq, keys = batch * saved.key_rows,
                d = weights.wo.dim(0);
  const int64_t r = shape.kv_lora_rank, width = shape.kv_a_width(), qd = shape.q_width(),
                cd = shape.context_width(), kvb = shape.kv_b_width(), nope = shape.qk_nope_head_dim,
                rope_dim = shape.qk_rope_head_dim, vd = shape.v_head_dim, qk = shape.qk_head_dim();
  // y = context·Woᵀ
  Tensor grad_context = Tensor::empty({n, cd});
  matmul(grad_y.data<float>(), weights.wo.data<float>(), grad_context.data<float>(), n, cd, d, false, false,
         false);
  matmul(grad_y.data<float>(), saved.context.data<float>(), grads.wo.data<float>(), d, cd, n, true, false,
         true);
  phases::QkvGrads g =
      phases::attend_backward(heads_of(shape), saved.probs, saved.q, saved.k, saved.v, batch, seq, saved.past,
                              saved.key_rows, grad_context, Tensor{}, nullptr);

  // The keys and values: k_nope_h and v_h come from kv = c_n·Wkv_bᵀ, k_rope (every head's) from the latent
  // row's rope part.
  Tensor grad_kv = Tensor::empty({keys, kvb});
  Tensor grad_latent = Tensor::zeros({keys, width});  // d c_n, then d k_rope (summed over the heads)
  float* gkv = grad_kv.data<float>();
  float* gl = grad_latent.data<float>();
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const float* gk = g.k.data<float>() + j * qd + h * qk;
      float* dst = gkv + j * kvb + h * (nope + vd);
      std::memcpy(dst, gk, sizeof(float) * static_cast<size_t>(nope));
      std::memcpy(dst + nope, g.v.data<float>() + j * cd + h * vd, sizeof(float) * static_cast<size_t>(vd));
      for (int64_t e = 0; e < rope_dim; ++e) gl[j * width + r + e] += gk[nope + e];
    }
  // grads.wkv_b += grad_kvᵀ·c_n, grad c_n = grad_kv·Wkv_b (into the latent rows' first kv_lora columns).
  matmul(MatmulArgs{.a = gkv,
                    .b = saved.latent.data<float>(),
                    .c = grads.wkv_b.data<float>(),
                    .m = kvb,
                    .n = r,
                    .k = keys,
                    .trans_a = true,
                    .accumulate = true,
                    .ldb = width});
  matmul(MatmulArgs{
      .a = gkv, .b = weights.wkv_b.data<float>(), .c = gl, .m = keys, .n = r, .k = kvb, .ldc = width});
  return {std::move(g.q), std::move(grad_latent)};
}

Tensor input_backward(const LatentAttentionShape& shape, const Rope& rope,
                      const LatentAttentionWeights& weights, const LatentAttentionSaved& saved, Tensor grad_q,
                      Tensor grad_latent, LatentAttentionGrads& grads) {
  const int64_t n = saved.batch * saved.seq, d = saved.x.dim(1), r = shape.kv_lora_rank,
                width = shape.kv_a_width(), qd = shape.q_width();
  const int32_t* pos = saved.positions.data<int32_t>();
  float* gl = grad_latent.data<float>();
  // The latent rows: inverse RoPE on k_rope, the kv_a norm's backward on c_n, then x·Wkv_aᵀ's.
  rope.apply(gl + r, n, 1, width, pos, true);
  Tensor grad_c_n = Tensor::empty({n, r});
  for (int64_t j = 0; j < n; ++j)
    std::memcpy(grad_c_n.data<float>() + j * r, gl + j * width, sizeof(float) * static_cast<size_t>(r));
  Tensor grad_c = rmsnorm_backward(saved.kv_norm, grad_c_n, weights.kv_a_norm, grads.kv_a_norm);
  for (int64_t j = 0; j < n; ++j)
    std::memcpy(gl + j * width, grad_c.data<float>() + j * r, sizeof(float) * static_cast<size_t>(r));
  Tensor grad_x = Tensor::empty({n, d});
  float* gx = grad_x.data<float>();
  const float* px = saved.x.data<float>();
  matmul(gl, weights.wkv_a.data<float>(), gx, n, d, width, false, false, false);
  matmul(gl, px, grads.wkv_a.data<float>(), width, d, n, true, false, true);

  // The queries.
  rotate_query_ropes(shape, rope, grad_q.data<float>(), n, pos, true);
  const float* gq = grad_q.data<float>();
  if (shape.q_lora_rank == 0) {
    matmul(gq, weights.wq.data<float>(), gx, n, d, qd, false, false, true);
    matmul(gq, px, grads.wq.data<float>(), qd, d, n, true, false, true);
  } else {
    const int64_t ql = shape.q_lora_rank;
    matmul(gq, saved.q_a.data<float>(), grads.wq_b.data<float>(), qd, ql, n, true, false, true);
    Tensor grad_q_a_n = Tensor::empty({n, ql});
    matmul(gq, weights.wq_b.data<float>(), grad_q_a_n.data<float>(), n, ql, qd, false, false, false);
    Tensor grad_q_a = rmsnorm_backward(saved.q_norm, grad_q_a_n, weights.q_a_norm, grads.q_a_norm);
    matmul(grad_q_a.data<float>(), weights.wq_a.data<float>(), gx, n, d, ql, false, false, true);
    matmul(grad_q_a.data<float>(), px, grads.wq_a.data<float>(), ql, d, n, true, false, true);
  }
  return grad_x;
}

}  // namespace latent_phases

using latent_phases::check_weights;
using latent_phases::expand_keys_values;
using latent_phases::project_latents;
using latent_phases::project_queries;

Tensor latent_attention_forward(const LatentAttentionShape& shape, const Rope& rope,
                                const LatentAttentionWeights& weights, const Tensor& x, int64_t batch,
                                int64_t seq, LatentAttentionSaved* saved) {
  const char* layer = "latent_attention_forward";
  const int64_t d = check_weights(shape, rope, weights, layer);
  EXPAR_CHECK(batch >= 0 && seq >= 0, "{}: batch={} seq={} must not be negative", layer, batch, seq);
  check_f32(x, layer, "x (batch·seq rows)", {batch * seq, d});
  EXPAR_CHECK(seq <= rope.max_positions(),
              "{}: seq={} exceeds the Rope's max_positions={}: build the Rope for the longest sequence",
              layer, seq, rope.max_positions());
  Tensor positions = phases::chunk_positions(batch, seq, 0);
  const int32_t* pos = positions.data<int32_t>();
  Tensor q = project_queries(shape, rope, weights, x, pos, saved);
  Tensor latent = project_latents(shape, rope, weights, x, pos, saved ? &saved->kv_norm : nullptr);
  Tensor y = latent_phases::attend_latents(shape, weights, q, latent, batch, seq, 0, saved);
  if (saved) {
    saved->x = x;
    saved->positions = positions;
  }
  return y;
}

Tensor latent_attention_backward(const LatentAttentionShape& shape, const Rope& rope,
                                 const LatentAttentionWeights& weights, const LatentAttentionSaved& saved,
                                 const Tensor& grad_y, LatentAttentionGrads& grads) {
  const char* layer = "latent_attention_backward";
  const int64_t d = check_weights(shape, rope, weights, layer);
  latent_phases::check_backward_call(shape, weights, saved, grad_y, grads, d, layer);
  EXPAR_CHECK(saved.past == 0,
              "{}: saved holds a chunk at position {} (a context-parallel forward's): run "
              "cp_latent_attention_backward over its CP group",
              layer, saved.past);
  latent_phases::LatentRowGrads g =
      latent_phases::attend_latents_backward(shape, weights, saved, grad_y, grads);
  return latent_phases::input_backward(shape, rope, weights, saved, std::move(g.q), std::move(g.latent),
                                       grads);
}

LatentKvCache LatentKvCache::create(int64_t capacity, const LatentAttentionShape& shape) {
  shape.validate();
  EXPAR_CHECK(capacity >= 0, "LatentKvCache::create: capacity={} must not be negative", capacity);
  LatentKvCache cache;
  cache.latent = Tensor::empty({capacity, shape.kv_a_width()}, DType::F32, MemCategory::KvCache);
  return cache;
}

namespace {

// q_abs [n, H·(kv_lora + rope)] from the queries q [n, H·(nope + rope)]: head h's q_lat_h = q_nope_h·W_UK_h
// (W_UK_h [nope, kv_lora]: head h's nope rows of Wkv_b), then its q_rope_h: a query against latent rows.
//
// Not matmul_weight: it multiplies x·Wᵀ, contracting over W's columns, and this product contracts over
// W_UK's rows. So each head's nope rows are widened (dequantize_rows: exactly the values every product of
// the stored weight multiplies by) into one per-thread scratch of nope × kv_lora floats and multiplied by
// sgemm; an F32 weight is multiplied in place. No f32 copy of Wkv_b is kept.
Tensor absorb_queries(const LatentAttentionShape& s, const Tensor& wkv_b, const Tensor& q) {
  const int64_t n = q.dim(0), r = s.kv_lora_rank, nope = s.qk_nope_head_dim, rope = s.qk_rope_head_dim,
                width = s.kv_a_width(), qk = s.qk_head_dim(), qd = s.q_width();
  const WeightView w = weight_view(wkv_b);
  const bool in_place = w.format == WeightFormat::F32;
  Tensor q_abs = Tensor::empty({n, s.n_heads * width});
  Tensor scratch = Tensor::empty({in_place ? 0 : task_threads(s.n_heads), nope * r});
  for_each_task(s.n_heads, [&](int64_t h, int thread) {
    const int64_t row0 = h * (nope + s.v_head_dim);
    const float* uk = nullptr;
    int64_t ld_uk = r;
    if (in_place) {
      uk = static_cast<const float*>(w.data) + row0 * w.ld;
      ld_uk = w.ld;
    } else {
      float* buffer = scratch.data<float>() + thread * nope * r;
      dequantize_rows(w, row0, row0 + nope, buffer, r);
      uk = buffer;
    }
    float* out = q_abs.data<float>() + h * width;
    matmul(MatmulArgs{.a = q.data<float>() + h * qk,
                      .b = uk,
                      .c = out,
                      .m = n,
                      .n = r,
                      .k = nope,
                      .lda = qd,
                      .ldb = ld_uk,
                      .ldc = s.n_heads * width});
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + i * s.n_heads * width + r, q.data<float>() + i * qd + h * qk + nope,
                  sizeof(float) * static_cast<size_t>(rope));
  });
  return q_abs;
}

}  // namespace

Tensor latent_attention_forward_cached(const LatentAttentionShape& shape, const Rope& rope,
                                       const LatentAttentionWeights& weights, const Tensor& x,
                                       std::span<const int64_t> new_tokens,
                                       std::span<LatentKvCache* const> caches, LatentForm form) {
  const char* layer = "latent_attention_forward_cached";
  const int64_t d = check_weights(shape, rope, weights, layer);
  EXPAR_CHECK(form == LatentForm::Expanded || form == LatentForm::Absorbed,
              "{}: form={} is neither Expanded nor Absorbed", layer, static_cast<int>(form));
  EXPAR_CHECK(new_tokens.size() == caches.size(),
              "{}: {} token counts for {} caches: pass one count and one cache per sequence", layer,
              new_tokens.size(), caches.size());
  const int64_t width = shape.kv_a_width(), r = shape.kv_lora_rank, H = shape.n_heads;
  const bool absorbed = form == LatentForm::Absorbed;
  // Validate everything before any cache is touched, so a bad call leaves the caches as they were.
  int64_t total = 0, longest = 0;
  std::unordered_set<const LatentKvCache*> seen;
  for (size_t i = 0; i < caches.size(); ++i) {
    const LatentKvCache* c = caches[i];
    EXPAR_CHECK(c != nullptr, "{}: cache {} is null: pass one cache per sequence", layer, i);
    EXPAR_CHECK(seen.insert(c).second, "{}: cache {} appears twice: each sequence needs its own cache", layer,
                i);
    EXPAR_CHECK(new_tokens[i] >= 0, "{}: new_tokens[{}]={} must not be negative", layer, i, new_tokens[i]);
    EXPAR_CHECK(c->latent.defined() && c->latent.ndim() == 2,
                "{}: cache {}'s latent has shape {}: it must be [capacity, kv_lora_rank + qk_rope_head_dim]: "
                "create caches with LatentKvCache::create",
                layer, i, shape_string(c->latent.shape()));
    const int64_t capacity = c->capacity();
    check_f32(c->latent, layer, "cache.latent", {capacity, width});
    phases::check_cache_room(layer, i, c->length, new_tokens[i], capacity, rope);
    total += new_tokens[i];
    // A one-token absorbed step's probabilities are all the heads' rows at once.
    const int64_t rows = absorbed && new_tokens[i] == 1 ? H : new_tokens[i];
    longest = std::max(longest, rows * (c->length + new_tokens[i]));
  }
  check_f32(x, layer, "x (Σ new_tokens rows)", {total, d});

  Tensor positions = Tensor::empty({total}, DType::I32);
  int32_t* pos = positions.data<int32_t>();
  for (size_t i = 0, row = 0; i < caches.size(); ++i)
    for (int64_t t = 0; t < new_tokens[i]; ++t) pos[row++] = static_cast<int32_t>(caches[i]->length + t);

  Tensor q = project_queries(shape, rope, weights, x, pos, nullptr);
  Tensor latent = project_latents(shape, rope, weights, x, pos, nullptr);
  // The new latent rows join each cache first; every new token then attends to its cache's rows.
  std::vector<int64_t> first_row(caches.size() + 1, 0);
  for (size_t i = 0; i < caches.size(); ++i) {
    LatentKvCache& c = *caches[i];
    const int64_t tq = new_tokens[i];
    if (tq > 0)
      std::memcpy(c.latent.data<float>() + c.length * width, latent.data<float>() + first_row[i] * width,
                  sizeof(float) * static_cast<size_t>(tq * width));
    first_row[i + 1] = first_row[i] + tq;
  }

  const int64_t cd = shape.context_width(), vd = shape.v_head_dim;
  Tensor context = Tensor::empty({total, cd});
  const auto seqs = static_cast<int64_t>(caches.size());
  if (!absorbed) {
    // Every attended position's keys and values from its latent row, one sequence at a time; then one task
    // per (sequence, head).
    const int64_t qd = shape.q_width();
    std::vector<Tensor> keys(caches.size()), values(caches.size());
    for (size_t i = 0; i < caches.size(); ++i) {
      const int64_t tk = caches[i]->length + new_tokens[i];
      if (new_tokens[i] == 0) continue;
      keys[i] = Tensor::empty({tk, qd});
      values[i] = Tensor::empty({tk, cd});
      expand_keys_values(shape, weights.wkv_b, caches[i]->latent.data<float>(), width, tk,
                         keys[i].data<float>(), values[i].data<float>());
    }
    const phases::HeadWidths widths = heads_of(shape).widths;
    const int64_t tasks = seqs * H;
    Tensor probs = Tensor::empty({task_threads(tasks), longest});
    for_each_task(tasks, [&](int64_t task, int thread) {
      const auto i = static_cast<size_t>(task / H);
      const int64_t h = task % H, tq = new_tokens[i], row0 = first_row[i];
      if (tq == 0) return;
      phases::attend_head(q.data<float>() + row0 * qd + h * widths.qk, qd,
                          keys[i].data<float>() + h * widths.qk, qd, values[i].data<float>() + h * vd, cd, tq,
                          caches[i]->length, widths, probs.data<float>() + thread * longest,
                          context.data<float>() + row0 * cd + h * vd, cd, 0, nullptr);
    });
  } else {
    // The heads' queries against the latent rows [c_n, k_rope] (qk width kv_lora + rope), whose first
    // kv_lora values are also the values: o_lat [total, H·kv_lora].
    Tensor q_abs = absorb_queries(shape, weights.wkv_b, q);
    Tensor o_lat = Tensor::empty({total, H * r});
    const phases::HeadWidths widths{width, r, static_cast<float>(shape.softmax_scale)};
    const int64_t lq = H * width, lo = H * r;
    // One task per sequence for a one-token step (every head in one product: the cache is read once), one
    // per (sequence, head) for a longer one. The split depends on the step's tokens only.
    std::vector<std::pair<size_t, int64_t>> tasks;  // (sequence, head; -1: every head)
    for (size_t i = 0; i < caches.size(); ++i) {
      if (new_tokens[i] == 1) tasks.emplace_back(i, -1);
      if (new_tokens[i] > 1)
        for (int64_t h = 0; h < H; ++h) tasks.emplace_back(i, h);
    }
    const auto n_tasks = static_cast<int64_t>(tasks.size());
    Tensor probs = Tensor::empty({task_threads(n_tasks), longest});
    for_each_task(n_tasks, [&](int64_t task, int thread) {
      const auto [i, h] = tasks[static_cast<size_t>(task)];
      const int64_t tq = new_tokens[i], row0 = first_row[i], past = caches[i]->length;
      const float* rows = caches[i]->latent.data<float>();
      float* p = probs.data<float>() + thread * longest;
      if (h < 0) {
        phases::attend_group_one_token(q_abs.data<float>() + row0 * lq, H, rows, width, rows, width, past,
                                       widths, p, o_lat.data<float>() + row0 * lo, 0, nullptr);
        return;
      }
      phases::attend_head(q_abs.data<float>() + row0 * lq + h * width, lq, rows, width, rows, width, tq, past,
                          widths, p, o_lat.data<float>() + row0 * lo + h * r, lo, 0, nullptr);
    });
    // context_h = o_lat_h·W_UV_hᵀ: W_UV_h (head h's v rows of Wkv_b) multiplied as stored.
    const WeightView w = weight_view(weights.wkv_b);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t row0 = h * (shape.qk_nope_head_dim + vd) + shape.qk_nope_head_dim;
      matmul_weight(WeightProduct{.x = o_lat.data<float>() + h * r,
                                  .m = total,
                                  .ldx = lo,
                                  .w = w.row_range(row0, row0 + vd),
                                  .y = context.data<float>() + h * vd,
                                  .ldy = cd});
    }
  }
  for (size_t i = 0; i < caches.size(); ++i) caches[i]->length += new_tokens[i];
  Tensor y = Tensor::empty({total, d});
  phases::project(context, weights.wo, y.data<float>(), false);
  return y;
}

}  // namespace expar::nn
