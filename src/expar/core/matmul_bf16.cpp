// BF16 products with f32 accumulation (core/matmul.hpp: matmul_bf16).
#include <omp.h>

#include <bit>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>

#include "expar/core/assert.hpp"
#include "expar/core/bf16_round.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matmul_edges.hpp"

namespace expar {
namespace {

using dnnl_dims = dnnl::memory::dims;
using dnnl_dt = dnnl::memory::data_type;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A 2-d matrix of `rows` × `cols`, row stride ld, or (transposed) its transpose stored with row stride ld:
// element (i, j) at i·ld + j, or at j·ld + i.
dnnl::memory::desc matrix_desc(int64_t rows, int64_t cols, int64_t ld, bool transposed, dnnl_dt type) {
  return dnnl::memory::desc({rows, cols}, type, transposed ? dnnl_dims{1, ld} : dnnl_dims{ld, 1});
}

// One primitive per (trans_a, trans_b, accumulate, compute threads), every size and leading dimension a
// runtime argument; per thread, like the compute threads. Creations are serialised over the process: ranks
// run as threads and first create theirs at the same moment, which ThreadSanitizer (blind to libdnnl's own,
// uninstrumented synchronisation) reported as a race on a lock oneDNN initialises; a creation happens once
// per layout and thread, so the mutex costs nothing measurable.
dnnl::matmul& primitive(bool trans_a, bool trans_b, bool accumulate, int threads) {
  thread_local std::map<std::tuple<bool, bool, bool, int>, dnnl::matmul> cache;
  const auto key = std::make_tuple(trans_a, trans_b, accumulate, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  constexpr int64_t R = DNNL_RUNTIME_DIM_VAL;
  const auto a = matrix_desc(R, R, R, trans_a, dnnl_dt::bf16);
  const auto b = matrix_desc(R, R, R, trans_b, dnnl_dt::bf16);
  const auto c = matrix_desc(R, R, R, false, dnnl_dt::f32);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  static std::mutex creation;
  std::lock_guard lock(creation);
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  } catch (const dnnl::error& e) {
    fail(
        "oneDNN has no BF16 matmul on this CPU (it runs {}): {}; BF16 products need AVX-512 (and BF16 dot "
        "products to run at their speed)",
        dnnl_isa_name(), e.what());
  }
}

}  // namespace

void matmul_bf16(const MatmulBf16Args& p) {
  EXPAR_ASSERT(p.m >= 0 && p.n >= 0 && p.k >= 0, "BF16 matmul with negative size m={} n={} k={}", p.m, p.n,
               p.k);
  EXPAR_CHECK(matmul_min_rows() == 0,
              "BF16 products do not run under batch invariance (row quantum {}): it is a rule of the f32 "
              "kernels (core/matmul.hpp)",
              matmul_min_rows());
  const auto [lda, ldb, ldc] = matmul_leading_dims(p);
  if (matmul_done_without_products(p, ldc)) return;
  dnnl::matmul& mm = primitive(p.trans_a, p.trans_b, p.accumulate, omp_get_max_threads());
  const dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  try {
    // oneDNN's memory objects take non-const handles; the operands are only read.
    dnnl::memory a(matrix_desc(p.m, p.k, lda, p.trans_a, dnnl_dt::bf16), engine, const_cast<uint16_t*>(p.a));
    dnnl::memory b(matrix_desc(p.k, p.n, ldb, p.trans_b, dnnl_dt::bf16), engine, const_cast<uint16_t*>(p.b));
    dnnl::memory c(matrix_desc(p.m, p.n, ldc, false, dnnl_dt::f32), engine, p.c);
    mm.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  } catch (const dnnl::error& e) {
    fail("oneDNN BF16 matmul failed ({}) for m={} n={} k={} lda={} ldb={} ldc={} trans_a={} trans_b={}",
         e.what(), p.m, p.n, p.k, lda, ldb, ldc, p.trans_a, p.trans_b);
  }
}

std::string dnnl_isa_name() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  // Widest first: each value is a superset of the bits of those below it.
  const std::pair<dnnl_cpu_isa_t, const char*> names[] = {{dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
                                                          {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
                                                          {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
                                                          {dnnl_cpu_isa_avx512_core, "avx512_core"},
                                                          {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
                                                          {dnnl_cpu_isa_avx2, "avx2"},
                                                          {dnnl_cpu_isa_avx, "avx"},
                                                          {dnnl_cpu_isa_sse41, "sse41"}};
  for (const auto& [bits, name] : names)
    if ((isa & bits) == bits) return name;
  return "no vector ISA";
}

bool bf16_native() {
  return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

void check_bf16_native(const std::string& what) {
  EXPAR_CHECK(bf16_native(),
              "{} needs a CPU with BF16 dot products (AVX512_BF16 or AMX-BF16), which oneDNN finds "
              "missing here: it runs {}{}; refused rather than run another, slower way",
              what, dnnl_isa_name(), std::getenv("DNNL_MAX_CPU_ISA") ? " (capped by DNNL_MAX_CPU_ISA)" : "");
}

void round_rows_to_bf16(const float* src, int64_t ld_src, uint16_t* dst, int64_t ld_dst, int64_t rows,
                        int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld_src;
    uint16_t* d = dst + r * ld_dst;
    for (int64_t c = 0; c < cols; ++c) d[c] = round_to_bf16(s[c]);
  }
}

}  // namespace expar
