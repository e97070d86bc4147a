#include "expar/core/matmul.hpp"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul_edges.hpp"
#include "expar/core/matvec.hpp"

namespace expar {
namespace {

thread_local int64_t tl_min_rows = 0;

// Runs p (m < rows, A not transposed) as a `rows`-row product over zero-padded copies of A and C, with the
// quantum off (matmul_in_blocks).
void matmul_padded(const MatmulArgs& p, int64_t rows, int64_t lda, int64_t ldc) {
  thread_local std::vector<float> a_pad, c_pad;
  a_pad.assign(static_cast<size_t>(rows * p.k), 0.0f);
  c_pad.assign(static_cast<size_t>(rows * p.n), 0.0f);
  for (int64_t i = 0; i < p.m; ++i) {
    std::memcpy(a_pad.data() + i * p.k, p.a + i * lda, sizeof(float) * static_cast<size_t>(p.k));
    if (p.accumulate)
      std::memcpy(c_pad.data() + i * p.n, p.c + i * ldc, sizeof(float) * static_cast<size_t>(p.n));
  }
  MatmulArgs q = p;
  q.a = a_pad.data();
  q.c = c_pad.data();
  q.m = rows;
  q.lda = p.k;
  q.ldc = p.n;
  matmul(q);  // the caller (matmul_in_blocks) has the quantum off
  for (int64_t i = 0; i < p.m; ++i)
    std::memcpy(p.c + i * ldc, c_pad.data() + i * p.n, sizeof(float) * static_cast<size_t>(p.n));
}

// Batch invariance (matmul.hpp): p in calls of a multiple of `quantum` rows, at most kBatchInvariantBlocks
// quanta each, the last zero-padded.
void matmul_in_blocks(const MatmulArgs& p, int64_t quantum, int64_t lda, int64_t ldc) {
  const int64_t block = kBatchInvariantBlocks * quantum;
  // The blocks themselves run as plain products (restored on the way out, an exception included).
  struct QuantumOff {
    int64_t saved = tl_min_rows;
    QuantumOff() { tl_min_rows = 0; }
    ~QuantumOff() { tl_min_rows = saved; }
  } off;
  for (int64_t begin = 0; begin < p.m; begin += block) {
    MatmulArgs q = p;
    q.a = p.a + begin * lda;
    q.c = p.c + begin * ldc;
    q.m = std::min(block, p.m - begin);
    q.lda = lda;
    q.ldc = ldc;
    const int64_t rows = (q.m + quantum - 1) / quantum * quantum;
    if (rows == q.m)
      matmul(q);
    else
      matmul_padded(q, rows, lda, ldc);
  }
}

}  // namespace

int64_t batch_invariant_rows() {
  // AVX-512 kernels: every m >= 16 gives a row the same bits (up to the block size); the AVX2 kernel works on
  // 6 rows, so 24. Below AVX2 (no FMA) oneDNN's kernels were not measured; 24 is kept.
  // The ISA values are bit sets: AVX-512 kernels run when every bit of avx512_core is set.
  static const int64_t rows =
      (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core ? 16 : 24;
  return rows;
}

void set_matmul_min_rows(int64_t rows) {
  EXPAR_CHECK(rows >= 0, "matmul minimum rows = {}: must be 0 (off) or positive", rows);
  tl_min_rows = rows;
}

int64_t matmul_min_rows() {
  return tl_min_rows;
}

bool matmul_runs_matvec(int64_t m, bool trans_a, bool trans_b) {
  return m == 1 && !trans_a && trans_b && tl_min_rows == 0;
}

void matmul(const MatmulArgs& p) {
  EXPAR_ASSERT(p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul with negative size m={} n={} k={}", p.m, p.n, p.k);
  const auto [lda, ldb, ldc] = matmul_leading_dims(p);
  if (matmul_done_without_products(p, ldc)) return;
  if (tl_min_rows > 0 && !p.trans_a &&
      (p.m % tl_min_rows != 0 || p.m > kBatchInvariantBlocks * tl_min_rows)) {
    matmul_in_blocks(p, tl_min_rows, lda, ldc);
    return;
  }
  // One row against a transposed matrix (the weights of decode's products): core/matvec reads them closer
  // to memory bandwidth than oneDNN's m = 1 kernel, whose bits were already its own (matmul.hpp). Batch
  // invariance never gets here with m = 1 (the quantum pads it above).
  if (matmul_runs_matvec(p.m, p.trans_a, p.trans_b)) {
    matvec_transposed(p.a, p.b, p.c, p.n, p.k, ldb, p.accumulate);
    return;
  }
  // oneDNN's row-major sgemm: no primitive to create per shape, which matters because grouped expert GEMMs
  // see a different row count every step (creating a matmul primitive for each shape would cost more than
  // many of those products take; docs/performance_history.md, "Small experts at d = 512 on the Zen 5 VM").
  // beta = 0 does not read C, so a poisoned (NaN) output buffer stays harmless.
  dnnl_status_t status = dnnl_sgemm(p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f, p.a,
                                    lda, p.b, ldb, p.accumulate ? 1.0f : 0.0f, p.c, ldc);
  EXPAR_CHECK(status == dnnl_success,
              "oneDNN sgemm failed (status {}) for m={} n={} k={} lda={} ldb={} ldc={}",
              static_cast<int>(status), p.m, p.n, p.k, lda, ldb, ldc);
}

void set_compute_threads(int threads) {
  EXPAR_ASSERT(threads >= 1, "compute threads = {}: must be at least 1", threads);
  omp_set_num_threads(threads);
}

int compute_threads() {
  return omp_get_max_threads();
}

}  // namespace expar
