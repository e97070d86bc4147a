#include "expar/nn/embedding.hpp"

#include <cstring>

#include "expar/core/assert.hpp"
#include "expar/nn/check.hpp"

namespace expar::nn {

namespace {
void check_tokens(const Tensor& tokens, int64_t vocab, const char* layer) {
  EXPAR_ASSERT(tokens.defined() && tokens.dtype() == DType::I32 && tokens.ndim() == 1,
               "{}: tokens is {} of shape {}: it must be I32 of shape [N]", layer, dtype_name(tokens.dtype()),
               shape_string(tokens.shape()));
  const int32_t* t = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i)
    EXPAR_CHECK(t[i] >= 0 && t[i] < vocab,
                "{}: token {} at position {} is outside the vocabulary [0, {}): check the tokenizer and the "
                "model's vocab_size",
                layer, t[i], i, vocab);
}
}  // namespace

Tensor embedding_forward(const Tensor& table, const Tensor& tokens, EmbeddingSaved* saved) {
  check_f32_matrix(table, "embedding_forward", "table");
  const int64_t vocab = table.dim(0), d = table.dim(1);
  check_tokens(tokens, vocab, "embedding_forward");
  const int64_t n = tokens.numel();
  Tensor out = Tensor::empty({n, d});
  const float* src = table.data<float>();
  float* dst = out.data<float>();
  const int32_t* t = tokens.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * d, src + static_cast<int64_t>(t[i]) * d, sizeof(float) * static_cast<size_t>(d));
  if (saved) saved->tokens = tokens;
  return out;
}

void embedding_backward(const EmbeddingSaved& saved, const Tensor& grad_out, Tensor& grad_table) {
  check_f32_matrix(grad_table, "embedding_backward", "grad_table");
  const int64_t vocab = grad_table.dim(0), d = grad_table.dim(1);
  check_tokens(saved.tokens, vocab, "embedding_backward");
  const int64_t n = saved.tokens.numel();
  check_f32(grad_out, "embedding_backward", "grad_out", {n, d});
  const float* g = grad_out.data<float>();
  float* dst = grad_table.data<float>();
  const int32_t* t = saved.tokens.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    float* row = dst + static_cast<int64_t>(t[i]) * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[i * d + j];
  }
}

}  // namespace expar::nn
