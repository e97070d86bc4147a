#pragma once
// The three products of a linear map y = x·Wᵀ with W [out, in] (PyTorch's orientation): the forward, the
// input gradient and the weight gradient. Attention's projections (nn/attention_phases) and the LM head
// (nn/linear) run theirs here, so the precision is chosen in this one place:
//  - f32 (`w_bf16` undefined): oneDNN's sgemm (core/matmul.hpp); the forward through core/weight_matmul,
//    which also multiplies an inference weight as its checkpoint stores it;
//  - mixed precision (issue #35, `expar train --precision bf16`: `w_bf16` is the BF16 copy of the f32
//    master W, core/tensor_convert.hpp's refresh_bf16_copy): BF16 × BF16 products with f32 accumulation
//    (core/matmul.hpp's matmul_bf16), the copy as the weight operand and each activation rounded to BF16
//    (nearest, ties to even) once, where it first enters a product (ProductRows), every product that reads it
//    reading that one rounding. The results stay f32: y, the input gradient, and the weight gradient, added
//    into the f32 gradient as in f32.
// Every operand is packed (row strides are the widths).
#include <cstdint>

#include "expar/core/tensor.hpp"

namespace expar::nn {

// An activation operand [m, width] of the products: its f32 rows, and under BF16 products their BF16
// rounding, made once by product_rows for every product that reads the operand (attention's input feeds
// the q, k and v projections and their three weight gradients; an output gradient, its layer's input and
// weight gradients).
struct ProductRows {
  const float* f32 = nullptr;
  Tensor bf16{};  // BF16 [m, width]; undefined under f32 products
};
ProductRows product_rows(const float* values, int64_t m, int64_t width, bool bf16);

// Whether a weight's products run in BF16: its copy is held.
inline bool bf16_products(const Tensor& w_bf16) {
  return w_bf16.defined();
}

// What a forward keeps of an activation whose only reader in the backward is its weight-gradient product
// (attention's input rows and context, the LM head's input): under BF16 products its BF16 rounding alone
// (half the bytes, the f32 rows free once the forward is done; the peers' autocast keeps these BF16 too),
// under f32 products `f32` itself.
Tensor saved_operand(const ProductRows& rows, const Tensor& f32);
// The backward's operand from what saved_operand kept, as the forward rounded it (nothing is rounded again).
// `what` names it in the error when the saved precision is not the products' (a forward with other copies).
ProductRows saved_rows(const Tensor& saved, bool bf16, const char* what);
// `saved` as saved_operand keeps it: F32 under f32 products, BF16 under BF16 products, of `shape`.
void check_saved_operand(const Tensor& saved, bool bf16, const char* layer, const char* what,
                         const Shape& shape);

// y [m, out] (+)= x [m, in]·Wᵀ.
void linear_product(const ProductRows& x, int64_t m, const Tensor& w, const Tensor& w_bf16, float* y,
                    bool accumulate);
// grad_x [m, in] (+)= grad_y [m, out]·W.
void linear_input_grad(const ProductRows& grad_y, int64_t m, const Tensor& w, const Tensor& w_bf16,
                       float* grad_x, bool accumulate);
// grad_w [out, in] += grad_yᵀ·x over the m rows; BF16 operands when both hold their rounding.
void linear_weight_grad(const ProductRows& grad_y, const ProductRows& x, int64_t m, Tensor& grad_w);

}  // namespace expar::nn
