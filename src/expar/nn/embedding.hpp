#pragma once
// Token embedding: row lookup in a table [V, d].
#include "expar/core/tensor.hpp"

namespace expar::nn {

struct EmbeddingSaved {
  Tensor tokens;  // int32 [N]; shares storage with the caller's tensor
};

// table [V, d] f32, tokens int32 [N] with every token in [0, V). Returns [N, d]. A token outside the
// vocabulary throws (it would read outside the table). `saved` may be nullptr (inference).
Tensor embedding_forward(const Tensor& table, const Tensor& tokens, EmbeddingSaved* saved);

// grad_table [V, d] += scatter of grad_out [N, d] by token, in token order (deterministic, no races).
void embedding_backward(const EmbeddingSaved& saved, const Tensor& grad_out, Tensor& grad_table);

}  // namespace expar::nn
