#include "expar/nn/linear_products.hpp"

#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/weight_matmul.hpp"

namespace expar::nn {

namespace {

// rows × cols f32 values (packed) rounded to BF16, in a scratch tensor the product reads.
Tensor rounded(const float* values, int64_t rows, int64_t cols) {
  Tensor out = Tensor::empty({rows, cols}, DType::BF16);
  round_rows_to_bf16(values, cols, static_cast<uint16_t*>(out.raw()), cols, rows, cols);
  return out;
}

const uint16_t* bf16_data(const Tensor& t) {
  return static_cast<const uint16_t*>(t.raw());
}

void check_copy(const Tensor& w, const Tensor& w_bf16) {
  EXPAR_CHECK(w_bf16.dtype() == DType::BF16 && w_bf16.shape() == w.shape(),
              "a weight's BF16 copy must be BF16 of its shape {}, got {} {} (make it with refresh_bf16_copy)",
              shape_string(w.shape()), dtype_name(w_bf16.dtype()), shape_string(w_bf16.shape()));
}

}  // namespace

void linear_product(const float* x, int64_t m, const Tensor& w, const Tensor& w_bf16, float* y,
                    bool accumulate) {
  if (!bf16_products(w_bf16)) {
    matmul_weight(WeightProduct{.x = x, .m = m, .w = weight_view(w), .y = y, .accumulate = accumulate});
    return;
  }
  check_copy(w, w_bf16);
  const int64_t out = w.dim(0), in = w.dim(1);
  const Tensor xb = rounded(x, m, in);
  matmul_bf16({.a = bf16_data(xb),
               .b = bf16_data(w_bf16),
               .c = y,
               .m = m,
               .n = out,
               .k = in,
               .trans_b = true,
               .accumulate = accumulate});
}

void linear_input_grad(const float* grad_y, int64_t m, const Tensor& w, const Tensor& w_bf16, float* grad_x,
                       bool accumulate) {
  const int64_t out = w.dim(0), in = w.dim(1);
  if (!bf16_products(w_bf16)) {
    matmul(grad_y, w.data<float>(), grad_x, m, in, out, false, false, accumulate);
    return;
  }
  check_copy(w, w_bf16);
  const Tensor gyb = rounded(grad_y, m, out);
  matmul_bf16({.a = bf16_data(gyb),
               .b = bf16_data(w_bf16),
               .c = grad_x,
               .m = m,
               .n = in,
               .k = out,
               .accumulate = accumulate});
}

void linear_weight_grad(const float* grad_y, const float* x, int64_t m, bool bf16, Tensor& grad_w) {
  const int64_t out = grad_w.dim(0), in = grad_w.dim(1);
  if (!bf16) {
    matmul(grad_y, x, grad_w.data<float>(), out, in, m, true, false, true);
    return;
  }
  const Tensor gyb = rounded(grad_y, m, out), xb = rounded(x, m, in);
  matmul_bf16({.a = bf16_data(gyb),
               .b = bf16_data(xb),
               .c = grad_w.data<float>(),
               .m = out,
               .n = in,
               .k = m,
               .trans_a = true,
               .accumulate = true});
}

}  // namespace expar::nn
