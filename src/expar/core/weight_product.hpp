#pragma once
// y[m, n] = x[m, k] · w[n, k]ᵀ: rows of a batch times a weight matrix as stored ([out, in], the layout of
// every Hugging Face linear weight), each operand row-major with its own row stride. The expert MLP's
// products (moe/expert_mlp.cpp) for experts of a few rows to a few thousand.
//
// Why not oneDNN: its sgemm packs each weight matrix per call before it multiplies, so at an expert's few
// rows the weights' fetch from memory is not hidden behind arithmetic, and a ragged row count costs it a
// remainder kernel; the expert MLP's previous form (sgemm with the weights as the left operand and the rows
// transposed in and out) paid transposes too. This kernel packs one panel of weight rows at a time and
// fetches the next panel's rows into L2 with prefetches spread over the current panel's arithmetic. Compared
// in one process (the Zen 5 VM, one thread, 16 experts, d = 512, h = 1024, weights from the host allocator's
// huge pages; docs/performance.md, "Small experts: weights fetched while multiplying"): the expert forward of
// 114-146 rows per expert took 2-4 % less time than the previous form, of 232-296 rows 0-2 % less (3.5 % at
// exactly 260), and of exactly 128 rows (a row count sgemm handles without remainder) 3 % more.
//
// The kernel: each panel of 2 vectors of w's rows (32 on AVX-512, 16 on AVX2) is packed transposed,
// [k][32], so that one load of the panel at k holds w[j..j+31][k]; a register tile of 12 rows of x (6 on AVX2)
// broadcasts x[i][k] against the panel's two vectors. Every element of y is one chain of fused multiply-adds
// over k in order, y[i][j] = fma(x[i][k-1], w[j][k-1], ... fma(x[i][0], w[j][0], 0)), carried through y
// between blocks of k: its bits do not depend on m, n, the row or panel it falls in, the thread count or the
// instruction set (AVX-512 and AVX2 give the same bits). Without AVX2 and FMA it runs through matmul()
// (oneDNN) instead, whose bits are its own (weight_product_fused() says which).
#include <cstdint>

namespace expar {

// y = x · wᵀ as above; y is written, never read before it is (a poisoned output stays harmless). Outside a
// parallel region, a product of many panels is spread over the compute threads by panels (the same bits).
// ldx >= k, ldw >= k, ldy >= n.
void weight_product(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t m,
                    int64_t n, int64_t k);

// Whether weight_product computes each element as the fused chain above in this build (AVX2 and FMA or
// AVX-512); false where it runs through oneDNN.
bool weight_product_fused();

// For tests: the same product with the AVX2 kernel (6 x 16 tiles) where this build has AVX-512, so that a
// test on an AVX-512 machine checks that both kernels give the same bits. Equal to weight_product elsewhere.
void weight_product_avx2_for_tests(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                                   int64_t ldy, int64_t m, int64_t n, int64_t k);

}  // namespace expar
