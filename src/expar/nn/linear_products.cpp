#include "expar/nn/linear_products.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/weight_matmul.hpp"

namespace expar::nn {

namespace {

const uint16_t* bf16_data(const Tensor& t) {
  return static_cast<const uint16_t*>(t.raw());
}

void check_copy(const Tensor& w, const Tensor& w_bf16) {
  EXPAR_CHECK(w_bf16.dtype() == DType::BF16 && w_bf16.shape() == w.shape(),
              "a weight's BF16 copy must be BF16 of its shape {}, got {} {} (make it with refresh_bf16_copy)",
              shape_string(w.shape()), dtype_name(w_bf16.dtype()), shape_string(w_bf16.shape()));
}

// The operand's BF16 rows [m, width], which a BF16 product needs.
const uint16_t* rounded_rows(const ProductRows& rows, int64_t m, int64_t width, const char* what) {
  EXPAR_ASSERT(rows.bf16.defined() && rows.bf16.dtype() == DType::BF16 && rows.bf16.ndim() == 2 &&
                   rows.bf16.dim(0) == m && rows.bf16.dim(1) == width,
               "a BF16 product's {} must hold its BF16 rows [{}, {}] (product_rows with bf16), got {} {}",
               what, m, width, dtype_name(rows.bf16.dtype()), shape_string(rows.bf16.shape()));
  return bf16_data(rows.bf16);
}

}  // namespace

ProductRows product_rows(const float* values, int64_t m, int64_t width, bool bf16) {
  ProductRows rows{.f32 = values};
  if (bf16) {
    rows.bf16 = Tensor::empty({m, width}, DType::BF16);
    round_rows_to_bf16(values, width, static_cast<uint16_t*>(rows.bf16.raw()), width, m, width);
  }
  return rows;
}

Tensor saved_operand(const ProductRows& rows, const Tensor& f32) {
  return rows.bf16.defined() ? rows.bf16 : f32;
}

ProductRows saved_rows(const Tensor& saved, bool bf16, const char* what) {
  EXPAR_ASSERT(saved.defined() && saved.ndim() == 2 && (saved.dtype() == DType::BF16) == bf16,
               "the saved {} is {} {}, but the backward's products are {}: run the forward with the same "
               "weight copies",
               what, dtype_name(saved.dtype()), shape_string(saved.shape()), bf16 ? "BF16" : "f32");
  if (bf16) return ProductRows{.bf16 = saved};
  return ProductRows{.f32 = saved.data<float>()};
}

void check_saved_operand(const Tensor& saved, bool bf16, const char* layer, const char* what,
                         const Shape& shape) {
  const DType want = bf16 ? DType::BF16 : DType::F32;
  EXPAR_ASSERT(saved.defined() && saved.dtype() == want && saved.shape() == shape,
               "{}: {} is {} {}: under {} products it must be {} {} (the forward's saved_operand)", layer,
               what, saved.defined() ? dtype_name(saved.dtype()) : "undefined", shape_string(saved.shape()),
               bf16 ? "BF16" : "f32", dtype_name(want), shape_string(shape));
}

void linear_product(const ProductRows& x, int64_t m, const Tensor& w, const Tensor& w_bf16, float* y,
                    bool accumulate) {
  if (!bf16_products(w_bf16)) {
    matmul_weight(WeightProduct{.x = x.f32, .m = m, .w = weight_view(w), .y = y, .accumulate = accumulate});
    return;
  }
  check_copy(w, w_bf16);
  const int64_t out = w.dim(0), in = w.dim(1);
  matmul_bf16({.a = rounded_rows(x, m, in, "input"),
               .b = bf16_data(w_bf16),
               .c = y,
               .m = m,
               .n = out,
               .k = in,
               .trans_b = true,
               .accumulate = accumulate});
}

void linear_input_grad(const ProductRows& grad_y, int64_t m, const Tensor& w, const Tensor& w_bf16,
                       float* grad_x, bool accumulate) {
  const int64_t out = w.dim(0), in = w.dim(1);
  if (!bf16_products(w_bf16)) {
    matmul(grad_y.f32, w.data<float>(), grad_x, m, in, out, false, false, accumulate);
    return;
  }
  check_copy(w, w_bf16);
  matmul_bf16({.a = rounded_rows(grad_y, m, out, "output gradient"),
               .b = bf16_data(w_bf16),
               .c = grad_x,
               .m = m,
               .n = in,
               .k = out,
               .accumulate = accumulate});
}

void linear_weight_grad(const ProductRows& grad_y, const ProductRows& x, int64_t m, Tensor& grad_w) {
  const int64_t out = grad_w.dim(0), in = grad_w.dim(1);
  EXPAR_ASSERT(
      grad_y.bf16.defined() == x.bf16.defined(),
      "a weight gradient's operands must both be BF16 rows or both f32 (product_rows with one bf16)");
  if (!x.bf16.defined()) {
    matmul(grad_y.f32, x.f32, grad_w.data<float>(), out, in, m, true, false, true);
    return;
  }
  matmul_bf16({.a = rounded_rows(grad_y, m, out, "output gradient"),
               .b = rounded_rows(x, m, in, "input"),
               .c = grad_w.data<float>(),
               .m = out,
               .n = in,
               .k = m,
               .trans_a = true,
               .accumulate = true});
}

}  // namespace expar::nn
