#include "expar/nn/context_parallel_attention.hpp"

#include <cstring>

#include "expar/comm/comm.hpp"
#include "expar/nn/attention_phases.hpp"
#include "expar/nn/check.hpp"

namespace expar::nn {

namespace {

// The gathered buffer holds, per member c, its k rows then its v rows: [C][2][B·S_c·kd].
// Keys and values of chunks 0 .. last, sequence-major: k/v [B·(last + 1)·S_c, kd].
void unpack_visible_chunks(const float* gathered, int64_t batch, int64_t chunk, int64_t kd, int last,
                           Tensor& k, Tensor& v) {
  const int64_t rows = (static_cast<int64_t>(last) + 1) * chunk, block = batch * chunk * kd;
  k = Tensor::empty({batch * rows, kd});
  v = Tensor::empty({batch * rows, kd});
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(chunk * kd);
  for (int c = 0; c <= last; ++c) {
    const float* kc = gathered + 2 * c * block;
    const float* vc = kc + block;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t dst = (b * rows + c * chunk) * kd, src = b * chunk * kd;
      std::memcpy(k.data<float>() + dst, kc + src, row_bytes);
      std::memcpy(v.data<float>() + dst, vc + src, row_bytes);
    }
  }
}

// The adjoint of unpack_visible_chunks: grad k/v [B·key_rows, kd] into send [C][2][B·S_c·kd] (zero for the
// chunks after `last`, which this rank's queries do not see).
void pack_chunk_grads(const Tensor& grad_k, const Tensor& grad_v, int64_t batch, int64_t chunk, int64_t kd,
                      int last, float* send, int members) {
  const int64_t rows = (static_cast<int64_t>(last) + 1) * chunk, block = batch * chunk * kd;
  std::memset(send, 0, sizeof(float) * static_cast<size_t>(2 * members * block));
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(chunk * kd);
  for (int c = 0; c <= last; ++c) {
    float* kc = send + 2 * c * block;
    float* vc = kc + block;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t src = (b * rows + c * chunk) * kd, dst = b * chunk * kd;
      std::memcpy(kc + dst, grad_k.data<float>() + src, row_bytes);
      std::memcpy(vc + dst, grad_v.data<float>() + src, row_bytes);
    }
  }
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
  const int64_t block = n * dims.kd;
  Tensor send = Tensor::empty({2 * block}, DType::F32, MemCategory::CommScratch);
  std::memcpy(send.data<float>(), own.k.data<float>(), sizeof(float) * static_cast<size_t>(block));
  std::memcpy(send.data<float>() + block, own.v.data<float>(), sizeof(float) * static_cast<size_t>(block));
  Tensor gathered = Tensor::empty({members * 2 * block}, DType::F32, MemCategory::CommScratch);
  cp.all_gather(send.data<float>(), gathered.data<float>(), static_cast<size_t>(2 * block), DType::F32);
  Tensor k, v;
  unpack_visible_chunks(gathered.data<float>(), batch, chunk, dims.kd, index, k, v);

  Tensor probs;
  Tensor context = phases::attend(shape, dims, own.q, k, v, batch, chunk, past, past + chunk, options,
                                  saved ? &probs : nullptr);
  Tensor y = phases::output_forward(dims, weights, context, options);
  if (saved) {
    saved->batch = batch;
    saved->seq = chunk;
    saved->past = past;
    saved->key_rows = past + chunk;
    saved->x = x;
    saved->positions = positions;
    saved->q = own.q;
    saved->k = k;
    saved->v = v;
    saved->probs = probs;
    saved->context = context;
  }
  return y;
}

Tensor cp_attention_backward(Comm& cp, const AttentionShape& shape, const Rope& rope,
                             const AttentionWeights& weights, const AttentionSaved& saved,
                             const Tensor& grad_y, AttentionGrads& grads, const AttentionOptions& options,
                             AttentionOptionGrads* option_grads) {
  const char* layer = "cp_attention_backward";
  const phases::Dims dims = phases::check_training_call(shape, rope, weights, options, layer);
  phases::check_backward_call(shape, dims, saved, grad_y, grads, options, option_grads, layer);
  const int members = cp.size(), index = cp.rank();
  EXPAR_CHECK(
      saved.past == index * saved.seq,
      "{}: saved holds the chunk at position {} of {}-position chunks but this is CP rank {}: run the "
      "backward over the CP group its forward ran on",
      layer, saved.past, saved.seq, index);
  Tensor grad_context = phases::output_backward(dims, weights, saved, grad_y, grads, options, option_grads);
  phases::QkvGrads g = phases::attend_backward(shape, dims, saved, grad_context, options, option_grads);

  // Every chunk's key/value gradient is the sum of what the chunks at and after it computed for it.
  const int64_t n = saved.batch * saved.seq, block = n * dims.kd;
  Tensor send = Tensor::empty({members * 2 * block}, DType::F32, MemCategory::CommScratch);
  pack_chunk_grads(g.k, g.v, saved.batch, saved.seq, dims.kd, index, send.data<float>(), members);
  Tensor mine = Tensor::empty({2 * block}, DType::F32, MemCategory::CommScratch);
  cp.reduce_scatter(send.data<float>(), mine.data<float>(), static_cast<size_t>(2 * block), DType::F32);
  Tensor grad_k = Tensor::empty({n, dims.kd}), grad_v = Tensor::empty({n, dims.kd});
  std::memcpy(grad_k.data<float>(), mine.data<float>(), sizeof(float) * static_cast<size_t>(block));
  std::memcpy(grad_v.data<float>(), mine.data<float>() + block, sizeof(float) * static_cast<size_t>(block));
  return phases::input_backward(shape, rope, weights, dims, saved, g.q, grad_k, grad_v, grads, options,
                                option_grads);
}

}  // namespace expar::nn
