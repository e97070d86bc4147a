#pragma once
// y[m, n] (+)= x[m, k]·Wᵀ for a weight W [n, k] in the format it is stored in (core/weight_view.hpp): the
// products of the inference engine.
//  - F32 weights go to matmul() as they are (oneDNN's sgemm; core/matvec for one row).
//  - The narrow formats, one row (decode): core/matvec, which reads the stored bytes once.
//  - The narrow formats, several rows (prefill, and decode of several sequences): W is dequantised tile by
//    tile into a cache-resident f32 scratch and each tile multiplied by oneDNN's sgemm; every weight is
//    decoded once per call. The values are exact, so each tile's product is the f32 product over the
//    dequantised rows. The tile height depends only on k, so under batch invariance (core/matmul.hpp) a row's
//    bits depend on its batch no more than matmul()'s do.
//  - Under ProductPrecision::BF16 (core/product_precision.hpp) the activations of a product over a narrow
//    weight are rounded to BF16 first. A BF16 weight then multiplies them in oneDNN's BF16 matmul (both
//    forms), except under batch invariance, whose row quantum is a rule of the f32 kernels: there, as for the
//    other narrow formats, the rounded values go through the f32 tiles above.
#include <cstdint>

#include "expar/core/weight_view.hpp"

namespace expar {

struct WeightProduct {
  const float* x = nullptr;  // [m, k], row stride ldx (-1: k)
  int64_t m = 0, ldx = -1;
  WeightView w;        // [n, k]
  float* y = nullptr;  // [m, n], row stride ldy (-1: n)
  int64_t ldy = -1;
  bool accumulate = false;  // y += x·Wᵀ instead of y = x·Wᵀ (y is never read otherwise)
};

void matmul_weight(const WeightProduct& p);

// The column form (moe/expert_mlp.hpp): yᵀ[n, cols] = W·xᵀ for xᵀ [k, cols], both packed, W [n, k] as stored:
// the weight is sgemm's left operand as it is, and xᵀ is read as it is by every tile. F32 weights go to
// matmul() whole; the narrow formats are dequantised tile by tile (weight_column_tile_rows rows each, a
// function of k only) and each tile multiplied by sgemm, every weight decoded once per call. A column's
// values are those of the same product over the dequantised W.
struct WeightColumnsProduct {
  WeightView w;               // [n, k]
  const float* xt = nullptr;  // [k, cols]
  int64_t cols = 0;
  float* yt = nullptr;  // [n, cols], written (never read)
};

void matmul_weight_columns(const WeightColumnsProduct& p);

// The rows of W dequantised per sgemm call for a product of inner dimension k.
int64_t weight_tile_rows(int64_t k);
// The rows of W dequantised per sgemm call in the column form.
int64_t weight_column_tile_rows(int64_t k);

}  // namespace expar
