#pragma once
// One row times a transposed matrix, c[n] (+)= a[k] · B[n, k]ᵀ: the m = 1 products of decode (every linear
// layer, expert and LM head row of a batch-1 step), which read each weight once and do 2 FLOPs per weight
// read, so they run at memory bandwidth or not at all. B is in the format it is stored in
// (core/weight_view.hpp): each weight is widened or decoded in registers to the f32 value it stands for, so a
// BF16 matrix is read as 2 bytes a weight and an MXFP4 one as about half a byte, and the sums are those of
// the f32 product over the dequantised matrix, bit for bit.
//
// Why not oneDNN: its sgemm is built for products with many rows; at m = 1 it read the weights further below
// a plain streaming read than this loop does, at one and at two threads, paired in one probe cycling through
// 1 GiB of matrices (docs/performance_history.md, "bench generate on the Zen 5 VM, before and after
// core/matvec").
//
// Why by hand for the narrow formats too: no library we use multiplies f32 rows by MXFP4 or block-scaled FP8
// weights, and oneDNN's BF16 products round the activations to BF16, which changes results (the engine's
// contract is the f32 sum over the stored weights' exact values).
//
// Under ProductPrecision::BF16 (core/product_precision.hpp, read on the calling thread) the activations of a
// product over a narrow weight are rounded to BF16 first; a BF16 weight then multiplies them on the CPU's
// BF16 dot products where the build has them (AVX512_BF16, -march), 32 weights an instruction as stored, an
// MXFP4 one too (its codes looked up as BF16 values, exact, each block's scale applied to its partial sums),
// and F16 and FP8 (or any format in a build without them) by the loops below over the rounded values.
//
// Each output is one thread's dot product over k in a fixed order (16-lane partial sums, then the lanes in
// order, then the tail), so the thread count never changes a result. GCC's vector extension: AVX-512 as
// one register, AVX2 as two, SSE as four (no instruction set assumed beyond what -march gives).
#include <cstdint>
#include <span>

#include "expar/core/weight_view.hpp"

namespace expar {

// c[j] = Σ_i a[i]·B(j, i) for j < b.rows, i < b.cols (c[j] += ... when accumulate; otherwise c is never
// read, so a poisoned output stays harmless).
struct MatvecProduct {
  const float* a;
  WeightView b;
  float* c;
  bool accumulate;
};

// Every product, spread over the compute threads when not inside a parallel region (and from 64 Ki weights
// in all): the products' rows are cut into chunks of about 128 KiB of weights, in order, product after
// product; each thread starts on its own contiguous run of them and, when it is done, takes chunks from the
// back of the run with the most left, so a thread that reads faster for a moment takes more of them instead
// of waiting for the other at the end of the region. Several products in one region (decode's experts) cost
// one region's start and end, not one per product. A chunk is whole rows of one product, each still one
// thread's sum in the order above: the same bits at any thread count and in any grouping of products.
void matvec_transposed_many(std::span<const MatvecProduct> products);

// One product (matvec_transposed_many of one).
void matvec_transposed(const float* a, const WeightView& b, float* c, bool accumulate);
// The same with an f32 B [n, k] of row stride ldb.
void matvec_transposed(const float* a, const float* b, float* c, int64_t n, int64_t k, int64_t ldb,
                       bool accumulate);

}  // namespace expar
