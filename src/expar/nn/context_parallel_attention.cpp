#include "expar/nn/context_parallel_attention.hpp"

#include <cstring>
#include <initializer_list>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/nn/attention_phases.hpp"
#include "expar/nn/check.hpp"
#include "expar/nn/latent_attention_phases.hpp"

namespace expar::nn {

namespace {

// All-gathers this rank's `own` tensors (each [B·S_c, width], chunk cp.rank() of B sequences) over the CP
// group in one collective and returns, for each, the rows of chunks 0 .. cp.rank() sequence-major,
// [B·(cp.rank() + 1)·S_c, width]: what this rank's queries see. The gathered buffer holds, per member c,
// its tensors one after another: [C][parts][B·S_c·width].
std::vector<Tensor> gather_visible_chunks(Comm& cp, std::initializer_list<const Tensor*> own, int64_t batch,
                                          int64_t chunk, int64_t width) {
  const int members = cp.size(), last = cp.rank();
  const auto parts = static_cast<int64_t>(own.size());
  const int64_t block = batch * chunk * width, rows = (static_cast<int64_t>(last) + 1) * chunk;
  Tensor send = Tensor::empty({parts * block}, DType::F32, MemCategory::CommScratch);
  int64_t part = 0;
  for (const Tensor* t : own)
    std::memcpy(send.data<float>() + part++ * block, t->data<float>(),
                sizeof(float) * static_cast<size_t>(block));
  Tensor gathered = Tensor::empty({members * parts * block}, DType::F32, MemCategory::CommScratch);
  cp.all_gather(send.data<float>(), gathered.data<float>(), static_cast<size_t>(parts * block), DType::F32);
  std::vector<Tensor> out;
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(chunk * width);
  for (part = 0; part < parts; ++part) {
    Tensor t = Tensor::empty({batch * rows, width});
    for (int c = 0; c <= last; ++c) {
      const float* src_chunk = gathered.data<float>() + (c * parts + part) * block;
      for (int64_t b = 0; b < batch; ++b)
        std::memcpy(t.data<float>() + (b * rows + c * chunk) * width, src_chunk + b * chunk * width,
                    row_bytes);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// The adjoint of gather_visible_chunks: the gradients of the visible rows (each [B·(cp.rank() + 1)·S_c,
// width]) are reduce-scattered over the CP group in one collective; returns, for each, the gradient of this
// rank's own rows [B·S_c, width]: the sum of what the chunks at and after it computed for them.
std::vector<Tensor> scatter_chunk_grads(Comm& cp, std::initializer_list<const Tensor*> grads, int64_t batch,
                                        int64_t chunk, int64_t width) {
  const int members = cp.size(), last = cp.rank();
  const auto parts = static_cast<int64_t>(grads.size());
  const int64_t block = batch * chunk * width, rows = (static_cast<int64_t>(last) + 1) * chunk;
  // Zero for the chunks after `last`, which this rank's queries do not see.
  Tensor send = Tensor::zeros({members * parts * block}, DType::F32, MemCategory::CommScratch);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(chunk * width);
  int64_t part = 0;
  for (const Tensor* g : grads) {
    for (int c = 0; c <= last; ++c) {
      float* dst_chunk = send.data<float>() + (c * parts + part) * block;
      for (int64_t b = 0; b < batch; ++b)
        std::memcpy(dst_chunk + b * chunk * width, g->data<float>() + (b * rows + c * chunk) * width,
                    row_bytes);
    }
    ++part;
  }
  Tensor mine = Tensor::empty({parts * block}, DType::F32, MemCategory::CommScratch);
  cp.reduce_scatter(send.data<float>(), mine.data<float>(), static_cast<size_t>(parts * block), DType::F32);
  std::vector<Tensor> out;
  for (part = 0; part < parts; ++part) {
    Tensor t = Tensor::empty({batch * chunk, width});
    std::memcpy(t.data<float>(), mine.data<float>() + part * block,
                sizeof(float) * static_cast<size_t>(block));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Tensor cp_attention_forward(Comm& cp, const AttentionShape& shape, const Rope& rope,
                            const AttentionWeights& weights, const Tensor& x, int64_t batch, int64_t chunk,
                            AttentionSaved* saved, const AttentionOptions& options) {
  const char* layer = "cp_attention_forward";
  const phases::Dims dims = phases::check_training_call(shape, rope, weights, options, layer);
  EXPAR_CHECK(batch >= 0 && chunk >= 0, "{}: batch={} chunk={} must not be negative", layer, batch, chunk);
  const int members = cp.size(), index = cp.rank();
  const int64_t n = batch * chunk, past = index * chunk, seq = members * chunk;
  check_f32(x, layer, "x (batch·chunk rows)", {n, dims.d});
  EXPAR_CHECK(seq <= rope.max_positions(),
              "{}: the whole sequence of {} chunks x {} positions = {} exceeds the Rope's max_positions={}: "
              "build the Rope for the longest sequence",
              layer, members, chunk, seq, rope.max_positions());
  Tensor positions = phases::chunk_positions(batch, chunk, past);
  phases::Qkv own = phases::project_qkv(shape, rope, weights, dims, x, positions, options, saved);

  // One all-gather carries both keys and values.
  std::vector<Tensor> kv = gather_visible_chunks(cp, {&own.k, &own.v}, batch, chunk, dims.kd);
  Tensor k = std::move(kv[0]), v = std::move(kv[1]);

  Tensor probs;
  Tensor context = phases::attend(shape, dims, own.q, k, v, batch, chunk, past, past + chunk, options,
                                  saved ? &probs : nullptr);
  Tensor y = phases::output_forward(dims, weights, context, options, saved);
  if (saved) {
    saved->batch = batch;
    saved->seq = chunk;
    saved->past = past;
    saved->key_rows = past + chunk;
    saved->positions = positions;
    saved->q = own.q;
    saved->k = k;
    saved->v = v;
    saved->probs = probs;
  }
  return y;
}

Tensor cp_attention_backward(Comm& cp, const AttentionShape& shape, const Rope& rope,
                             const AttentionWeights& weights, const AttentionSaved& saved,
                             const Tensor& grad_y, AttentionGrads& grads, const AttentionOptions& options,
                             AttentionOptionGrads* option_grads) {
  const char* layer = "cp_attention_backward";
  const phases::Dims dims = phases::check_training_call(shape, rope, weights, options, layer);
  phases::check_backward_call(shape, dims, weights, saved, grad_y, grads, options, option_grads, layer);
  const int index = cp.rank();
  EXPAR_CHECK(
      saved.past == index * saved.seq,
      "{}: saved holds the chunk at position {} of {}-position chunks but this is CP rank {}: run the "
      "backward over the CP group its forward ran on",
      layer, saved.past, saved.seq, index);
  Tensor grad_context = phases::output_backward(dims, weights, saved, grad_y, grads, options, option_grads);
  phases::QkvGrads g = phases::attend_backward(shape, dims, saved, grad_context, options, option_grads);

  // Every chunk's key/value gradient is the sum of what the chunks at and after it computed for it.
  std::vector<Tensor> mine = scatter_chunk_grads(cp, {&g.k, &g.v}, saved.batch, saved.seq, dims.kd);
  return phases::input_backward(shape, rope, weights, dims, saved, g.q, mine[0], mine[1], grads, options,
                                option_grads);
}

Tensor cp_latent_attention_forward(Comm& cp, const LatentAttentionShape& shape, const Rope& rope,
                                   const LatentAttentionWeights& weights, const Tensor& x, int64_t batch,
                                   int64_t chunk, LatentAttentionSaved* saved) {
  const char* layer = "cp_latent_attention_forward";
  const int64_t d = latent_phases::check_weights(shape, rope, weights, layer);
  EXPAR_CHECK(batch >= 0 && chunk >= 0, "{}: batch={} chunk={} must not be negative", layer, batch, chunk);
  const int members = cp.size(), index = cp.rank();
  const int64_t past = index * chunk, seq = members * chunk;
  check_f32(x, layer, "x (batch·chunk rows)", {batch * chunk, d});
  EXPAR_CHECK(seq <= rope.max_positions(),
              "{}: the whole sequence of {} chunks x {} positions = {} exceeds the Rope's max_positions={}: "
              "build the Rope for the longest sequence",
              layer, members, chunk, seq, rope.max_positions());
  Tensor positions = phases::chunk_positions(batch, chunk, past);
  const int32_t* pos = positions.data<int32_t>();
  Tensor q = latent_phases::project_queries(shape, rope, weights, x, pos, saved);
  Tensor own =
      latent_phases::project_latents(shape, rope, weights, x, pos, saved ? &saved->kv_norm : nullptr);
  // The latent rows travel (kv_lora + rope floats a token), not the keys and values they expand to.
  std::vector<Tensor> latent = gather_visible_chunks(cp, {&own}, batch, chunk, shape.kv_a_width());
  Tensor y = latent_phases::attend_latents(shape, weights, q, latent[0], batch, chunk, past, saved);
  if (saved) {
    saved->x = x;
    saved->positions = positions;
  }
  return y;
}

Tensor cp_latent_attention_backward(Comm& cp, const LatentAttentionShape& shape, const Rope& rope,
                                    const LatentAttentionWeights& weights, const LatentAttentionSaved& saved,
                                    const Tensor& grad_y, LatentAttentionGrads& grads) {
  const char* layer = "cp_latent_attention_backward";
  const int64_t d = latent_phases::check_weights(shape, rope, weights, layer);
  latent_phases::check_backward_call(shape, weights, saved, grad_y, grads, d, layer);
  EXPAR_CHECK(
      saved.past == cp.rank() * saved.seq,
      "{}: saved holds the chunk at position {} of {}-position chunks but this is CP rank {}: run the "
      "backward over the CP group its forward ran on",
      layer, saved.past, saved.seq, cp.rank());
  latent_phases::LatentRowGrads g =
      latent_phases::attend_latents_backward(shape, weights, saved, grad_y, grads);
  std::vector<Tensor> mine = scatter_chunk_grads(cp, {&g.latent}, saved.batch, saved.seq, shape.kv_a_width());
  return latent_phases::input_backward(shape, rope, weights, saved, std::move(g.q), std::move(mine[0]),
                                       grads);
}

}  // namespace expar::nn
