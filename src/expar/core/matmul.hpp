#pragma once
// Every matrix product in expar goes through oneDNN's matmul primitive (f32, row-major).
#include <cstdint>

namespace expar {

struct MatmulArgs {
  const float* a = nullptr;  // op(A) is [m, k]
  const float* b = nullptr;  // op(B) is [k, n]
  float* c = nullptr;        // C is [m, n]
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;                  // A stored as [k, m]
  bool trans_b = false;                  // B stored as [n, k]
  bool accumulate = false;               // C += op(A)·op(B) instead of C = op(A)·op(B)
  int64_t lda = -1, ldb = -1, ldc = -1;  // leading dimensions (row strides); -1 = packed
};

// C (+)= op(A)·op(B). Zero-sized products are no-ops (a k = 0 product clears C unless accumulating).
void matmul(const MatmulArgs& args);

// Convenience: C[m,n] = A[m,k]·B[k,n] (+ C when accumulate), with optional transposes.
inline void matmul(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
                   bool trans_b, bool accumulate) {
  MatmulArgs args;
  args.a = a;
  args.b = b;
  args.c = c;
  args.m = m;
  args.n = n;
  args.k = k;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.accumulate = accumulate;
  matmul(args);
}

// Batch invariance (expar serve): oneDNN's sgemm picks its kernel by the row count m, so row i of a product
// depends on how many other rows share the call (measured here, 1 and 2 threads: m = 1, m = 2..8 and
// m = 9, 12, 15 give bits of their own; every m tried from 16 to 512 gives the same bits). With a minimum of R rows set on the calling
// thread, products with fewer than R rows (and A not transposed) run as R-row products over zero-padded
// copies, so a row's result no longer depends on its batch. 0 (the default) turns it off. Per thread, like
// the compute threads: each rank sets its own.
void set_matmul_min_rows(int64_t rows);
int64_t matmul_min_rows();
// The row count from which this build's sgemm gives batch-independent rows (see above).
inline constexpr int64_t kBatchInvariantRows = 16;

// Number of compute (OpenMP) threads oneDNN uses on the calling thread. Each rank sets its own, so that
// ranks x compute threads never exceeds the cores.
void set_compute_threads(int threads);
int compute_threads();

}  // namespace expar
