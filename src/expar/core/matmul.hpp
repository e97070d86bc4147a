#pragma once
// Every matrix product in expar goes through here (f32, row-major): oneDNN's sgemm, except one row against a
// transposed matrix (decode's products), which core/matvec reads closer to memory bandwidth.
#include <cstdint>
#include <string>

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

// Whether matmul() hands a product of m rows with these operand layouts to core/matvec on the calling
// thread: m = 1, A as stored, B transposed, batch invariance off. A caller with several such products may run
// them as one matvec_transposed_many region instead (decode's experts): the same bits.
bool matmul_runs_matvec(int64_t m, bool trans_a, bool trans_b);

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

// Mixed precision: C (+)= op(A)·op(B) with A and B BF16 (uint16 storage, the upper half of an f32, as
// DType::BF16 tensors hold them) and C f32, every product and sum in f32 (oneDNN's matmul primitive with
// bf16 inputs and an f32 output). The same transposes, leading dimensions, accumulate semantics and edge
// cases (m or n = 0: no-op; k = 0: clears C unless accumulating) as matmul(). oneDNN creates its primitives
// per layout, not per shape: every size and leading dimension is a runtime argument (DNNL_RUNTIME_DIM_VAL),
// so the grouped expert GEMMs' changing row counts reuse one primitive per (transposes, accumulate, compute
// threads), cached per thread. (Measured on this VM, a Xeon with AMX: creating one costs 0.03-0.05 ms, and
// the runtime-size primitive ran at 1.1-1.7 TFLOP/s on 2 threads at m = 128-2048, within the spread of the
// fixed-shape brgemm one's 1.2-1.7; /tmp probe, not kept.)
// Not under batch invariance (matmul_min_rows() > 0): its row quantum is a rule of the f32 kernels; refused.
// Where oneDNN has no BF16 matmul at all (CPUs below AVX-512) it throws expar::Error saying so; on AVX-512
// CPUs without BF16 dot products oneDNN converts to f32 (correct, slower than sgemm): callers that promise
// speed ask bf16_native() first.
struct MatmulBf16Args {
  const uint16_t* a = nullptr;  // op(A) is [m, k]
  const uint16_t* b = nullptr;  // op(B) is [k, n]
  float* c = nullptr;           // C is [m, n]
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;
  bool trans_b = false;
  bool accumulate = false;
  int64_t lda = -1, ldb = -1, ldc = -1;
};
void matmul_bf16(const MatmulBf16Args& args);

// Whether oneDNN multiplies BF16 on this CPU's BF16 dot-product instructions (AVX512_BF16, or AMX-BF16):
// its effective ISA (DNNL_MAX_CPU_ISA included) has avx512_core_bf16. Without them, `--precision bf16` is
// refused by name (check_bf16_native), never silently run another way.
bool bf16_native();
// The CPU ISA oneDNN runs on, by oneDNN's name ("avx512_core_amx", "avx512_core_bf16", "avx2", ...).
std::string dnnl_isa_name();
// Throws expar::Error "<what> needs a CPU with BF16 dot products (...): oneDNN runs <isa> here" unless
// bf16_native().
void check_bf16_native(const std::string& what);

// dst[r·ld_dst + c] = f32_to_bf16(src[r·ld_src + c]) (core/convert.hpp: nearest, ties to even; NaN stays
// NaN) for r < rows, c < cols: the activations a BF16 product reads.
void round_rows_to_bf16(const float* src, int64_t ld_src, uint16_t* dst, int64_t ld_dst, int64_t rows,
                        int64_t cols);

// Batch invariance (expar serve): oneDNN's sgemm picks its kernels and blocking by the row count m, so row i
// of a product can depend on how many other rows share the call and on where in the call it sits. Measured
// (probe programs not kept; tests/core/matmul_rows_test checks the rule below, also under AVX2 dispatch):
// - AVX-512 (this development VM): m = 1, 2..8 and 9, 12, 15 give bits of their own; every m from 16 to 512
//   gives the same bits at 1 and 2 threads, but at 2 threads m = 1024 changes the blocking (seen at k = 1024
//   with n = 32000 and at k = 2048 and 4096);
// - AVX2 (oneDNN capped with DNNL_MAX_CPU_ISA=AVX2): a 6-row kernel whose tail of 1-3 rows rounds
//   differently, so a row's bits depend on its position modulo 6; and from m = 270-546 rows (by shape) a
//   different blocking changes every row.
// So under batch invariance, with a row quantum q set on the calling thread, a product (A not transposed)
// runs as calls of exactly a multiple of q rows and at most kBatchInvariantBlocks · q rows: m is cut into
// blocks of that many rows from the first, and the last block is zero-padded up to a multiple of q. Every
// call then has a row count in {q, 2q, ..., 10q} and every row a position that is a multiple of q plus its
// offset in the block, which for q a multiple of the kernel's rows is the same kernel: a row's result no
// longer depends on its batch. q = batch_invariant_rows(): 16 where oneDNN runs AVX-512 kernels, else 24
// (a multiple of 6 and 8). 0 (the default) turns it off. Per thread, like the compute threads: each rank
// sets its own.
void set_matmul_min_rows(int64_t rows);
int64_t matmul_min_rows();
inline constexpr int64_t kBatchInvariantBlocks = 10;
// The row quantum for batch invariance on this machine's oneDNN kernels (see above).
int64_t batch_invariant_rows();

// Number of compute (OpenMP) threads oneDNN uses on the calling thread. Each rank sets its own, so that
// ranks x compute threads never exceeds the cores.
void set_compute_threads(int threads);
int compute_threads();

}  // namespace expar
