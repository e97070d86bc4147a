#include "expar/nn/linear.hpp"

#include "expar/nn/check.hpp"
#include "expar/nn/linear_products.hpp"

namespace expar::nn {

Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, LinearSaved* saved,
                      const Tensor& weight_bf16) {
  check_f32_matrix(weight, "linear_forward", "weight");
  const int64_t out = weight.dim(0), in = weight.dim(1);
  check_f32_matrix(x, "linear_forward", "x");
  const int64_t n = x.dim(0);
  check_f32(x, "linear_forward", "x", {n, in});
  Tensor y = Tensor::empty({n, out});
  const ProductRows xr = product_rows(x.data<float>(), n, in, bf16_products(weight_bf16));
  linear_product(xr, n, weight, weight_bf16, y.data<float>(), false);
  if (bias) {
    check_f32(*bias, "linear_forward", "bias", {out});
    const float* b = bias->data<float>();
    float* py = y.data<float>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) py[i * out + j] += b[j];
  }
  if (saved) saved->x = saved_operand(xr, x);
  return y;
}

Tensor linear_backward(const LinearSaved& saved, const Tensor& grad_y, const Tensor& weight,
                       Tensor& grad_weight, Tensor* grad_bias, const Tensor& weight_bf16) {
  check_f32_matrix(weight, "linear_backward", "weight");
  const int64_t out = weight.dim(0), in = weight.dim(1);
  const bool bf16 = bf16_products(weight_bf16);
  EXPAR_ASSERT(saved.x.defined() && saved.x.ndim() == 2,
               "linear_backward: saved.x is not a matrix: run "
               "linear_forward with a LinearSaved first");
  const int64_t n = saved.x.dim(0);
  check_saved_operand(saved.x, bf16, "linear_backward", "saved.x", {n, in});
  check_f32(grad_y, "linear_backward", "grad_y", {n, out});
  check_f32(grad_weight, "linear_backward", "grad_weight", {out, in});
  Tensor grad_x = Tensor::empty({n, in});
  const ProductRows gy = product_rows(grad_y.data<float>(), n, out, bf16);
  linear_input_grad(gy, n, weight, weight_bf16, grad_x.data<float>(), false);
  linear_weight_grad(gy, saved_rows(saved.x, bf16, "linear input"), n, grad_weight);
  if (grad_bias) {
    check_f32(*grad_bias, "linear_backward", "grad_bias", {out});
    float* gb = grad_bias->data<float>();
    const float* gy = grad_y.data<float>();
    // Row by row in a fixed order: deterministic regardless of threads.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) gb[j] += gy[i * out + j];
  }
  return grad_x;
}

}  // namespace expar::nn
