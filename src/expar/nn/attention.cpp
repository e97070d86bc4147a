#include "expar/nn/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/nn/attention_phases.hpp"
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

using phases::add_bias;
using phases::attend_group_one_token;
using phases::attend_head;
using phases::Dims;
using phases::project;

Tensor attention_forward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                         const Tensor& x, int64_t batch, int64_t seq, AttentionSaved* saved,
                         const AttentionOptions& options) {
  const Dims dims = phases::check_training_call(shape, rope, weights, options, "attention_forward");
  EXPAR_CHECK(batch >= 0 && seq >= 0, "attention_forward: batch={} seq={} must not be negative", batch, seq);
  const int64_t n = batch * seq;
  check_f32(x, "attention_forward", "x (batch·seq rows)", {n, dims.d});
  EXPAR_CHECK(seq <= rope.max_positions(),
              "attention_forward: seq={} exceeds the Rope's max_positions={}: build the Rope for the longest "
              "sequence",
              seq, rope.max_positions());
  Tensor positions = phases::chunk_positions(batch, seq, 0);
  phases::Qkv qkv = phases::project_qkv(shape, rope, weights, dims, x, positions, options, saved);
  Tensor probs;
  Tensor context =
      phases::attend(shape, dims, qkv.q, qkv.k, qkv.v, batch, seq, 0, seq, options, saved ? &probs : nullptr);
  Tensor y = phases::output_forward(dims, weights, context, options, saved);
  if (saved) {
    saved->batch = batch;
    saved->seq = seq;
    saved->past = 0;
    saved->key_rows = seq;
    saved->positions = positions;
    saved->q = qkv.q;
    saved->k = qkv.k;
    saved->v = qkv.v;
    saved->probs = probs;
  }
  return y;
}

Tensor attention_backward(const AttentionShape& shape, const Rope& rope, const AttentionWeights& weights,
                          const AttentionSaved& saved, const Tensor& grad_y, AttentionGrads& grads,
                          const AttentionOptions& options, AttentionOptionGrads* option_grads) {
  const char* layer = "attention_backward";
  const Dims dims = phases::check_training_call(shape, rope, weights, options, layer);
  phases::check_backward_call(shape, dims, weights, saved, grad_y, grads, options, option_grads, layer);
  EXPAR_CHECK(saved.past == 0,
              "{}: saved holds a sequence chunk at position {} (context parallelism): run its backward with "
              "cp_attention_backward over the same CP group",
              layer, saved.past);
  Tensor grad_context = phases::output_backward(dims, weights, saved, grad_y, grads, options, option_grads);
  phases::QkvGrads g = phases::attend_backward(shape, dims, saved, grad_context, options, option_grads);
  return phases::input_backward(shape, rope, weights, dims, saved, g.q, g.k, g.v, grads, options,
                                option_grads);
}

KvCache KvCache::create(int64_t capacity, const AttentionShape& shape) {
  shape.validate();
  EXPAR_CHECK(capacity >= 0, "KvCache::create: capacity={} must not be negative", capacity);
  KvCache cache;
  cache.k = Tensor::empty({shape.n_kv_heads, capacity, shape.head_dim}, DType::F32, MemCategory::KvCache);
  cache.v = Tensor::empty({shape.n_kv_heads, capacity, shape.head_dim}, DType::F32, MemCategory::KvCache);
  return cache;
}

Tensor attention_forward_cached(const AttentionShape& shape, const Rope& rope,
                                const AttentionWeights& weights, const Tensor& x,
                                std::span<const int64_t> new_tokens, std::span<KvCache* const> caches,
                                const AttentionOptions& options) {
  const char* layer = "attention_forward_cached";
  const Dims dims = phases::check_weights(shape, rope, weights, layer);
  phases::check_options(shape, dims, options, layer);
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
    EXPAR_ASSERT(c->k.defined() && c->k.ndim() == 3, "{}: cache {}'s keys are not [n_kv_heads, capacity, "
                 "head_dim]: create caches with KvCache::create", layer, i);
    const int64_t capacity = c->capacity();
    check_f32(c->k, layer, "cache.k", {shape.n_kv_heads, capacity, hd});
    check_f32(c->v, layer, "cache.v", {shape.n_kv_heads, capacity, hd});
    phases::check_cache_room(layer, i, c->length, new_tokens[i], capacity, rope);
    total += new_tokens[i];
    // A one-token step's probabilities are the group's rows at once (attend_group_one_token).
    longest = std::max(longest, (new_tokens[i] == 1 ? group : new_tokens[i]) * (c->length + new_tokens[i]));
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

  Tensor context = Tensor::empty({total, dims.qd});
  // The new keys and values join each cache first; then every (sequence, head) attends, spread over the
  // compute threads, each with probabilities of its own.
  std::vector<int64_t> first_row(caches.size() + 1, 0);
  for (size_t i = 0; i < caches.size(); ++i) {
    KvCache& c = *caches[i];
    const int64_t tq = new_tokens[i], row0 = first_row[i], capacity = c.capacity();
    const size_t head_bytes = sizeof(float) * static_cast<size_t>(hd);
    for (int64_t g = 0; g < shape.n_kv_heads; ++g)
      for (int64_t t = 0; t < tq; ++t) {
        const int64_t from = (row0 + t) * dims.kd + g * hd, to = (g * capacity + c.length + t) * hd;
        std::memcpy(c.k.data<float>() + to, k.data<float>() + from, head_bytes);
        std::memcpy(c.v.data<float>() + to, v.data<float>() + from, head_bytes);
      }
    first_row[i + 1] = row0 + tq;
  }
  // One task per (sequence, key/value head): a one-token step attends with the group's query heads as one
  // product's rows (decode), a longer one head after head. The split depends on the step's tokens only,
  // never on the thread count.
  const auto tasks = static_cast<int64_t>(caches.size()) * shape.n_kv_heads;
  Tensor probs = Tensor::empty({task_threads(tasks), longest});
  const float* sinks =
      options.sinks.defined() && options.sinks.numel() > 0 ? options.sinks.data<float>() : nullptr;
  for_each_task(tasks, [&](int64_t task, int thread) {
    const auto i = static_cast<size_t>(task / shape.n_kv_heads);
    const int64_t g = task % shape.n_kv_heads, tq = new_tokens[i], row0 = first_row[i];
    if (tq == 0) return;
    const KvCache& c = *caches[i];
    float* p = probs.data<float>() + thread * longest;
    const float* kg = c.k.data<float>() + g * c.capacity() * hd;
    const float* vg = c.v.data<float>() + g * c.capacity() * hd;
    const int64_t h0 = g * group;
    if (tq == 1) {
      attend_group_one_token(q.data<float>() + row0 * dims.qd + h0 * hd, group, kg, vg, hd, c.length, hd,
                             p, context.data<float>() + row0 * dims.qd + h0 * hd, options.window,
                             sinks ? sinks + h0 : nullptr);
      return;
    }
    for (int64_t h = h0; h < h0 + group; ++h)
      attend_head(q.data<float>() + row0 * dims.qd + h * hd, dims.qd, kg, vg, hd, tq, c.length, hd, p,
                  context.data<float>() + row0 * dims.qd + h * hd, dims.qd, options.window,
                  sinks ? sinks + h : nullptr);
  });
  for (size_t i = 0; i < caches.size(); ++i) caches[i]->length += new_tokens[i];
  Tensor y = Tensor::empty({total, dims.d});
  project(context, weights.wo, y.data<float>(), false);
  add_bias(y.data<float>(), total, dims.d, options.bo);
  return y;
}

}  // namespace expar::nn
