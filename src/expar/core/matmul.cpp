#include "expar/core/matmul.hpp"

#include <omp.h>

#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <tuple>

#include "expar/core/error.hpp"

namespace expar {

namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, int64_t, int64_t, int64_t>;

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, dnnl::matmul> primitives;
};

Context& context() {
  thread_local Context ctx;
  return ctx;
}

}  // namespace

void matmul(const MatmulArgs& p) {
  EXPAR_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul with negative size m={} n={} k={}", p.m, p.n, p.k);
  if (p.m == 0 || p.n == 0) return;
  const int64_t lda = p.lda >= 0 ? p.lda : (p.trans_a ? p.m : p.k);
  const int64_t ldb = p.ldb >= 0 ? p.ldb : (p.trans_b ? p.k : p.n);
  const int64_t ldc = p.ldc >= 0 ? p.ldc : p.n;
  if (p.k == 0) {
    if (!p.accumulate)
      for (int64_t i = 0; i < p.m; ++i) std::memset(p.c + i * ldc, 0, sizeof(float) * static_cast<size_t>(p.n));
    return;
  }
  Context& ctx = context();
  Key key{p.m, p.n, p.k, p.trans_a, p.trans_b, p.accumulate, lda, ldb, ldc};
  auto it = ctx.primitives.find(key);
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  dnnl::memory::desc a_md(dims{p.m, p.k}, dt::f32, p.trans_a ? dims{1, lda} : dims{lda, 1});
  dnnl::memory::desc b_md(dims{p.k, p.n}, dt::f32, p.trans_b ? dims{1, ldb} : dims{ldb, 1});
  dnnl::memory::desc c_md(dims{p.m, p.n}, dt::f32, dims{ldc, 1});
  if (it == ctx.primitives.end()) {
    dnnl::primitive_attr attr;
    if (p.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::desc desc(a_md, b_md, c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, ctx.engine);
    it = ctx.primitives.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::memory a_mem(a_md, ctx.engine, const_cast<float*>(p.a));
  dnnl::memory b_mem(b_md, ctx.engine, const_cast<float*>(p.b));
  dnnl::memory c_mem(c_md, ctx.engine, p.c);
  it->second.execute(ctx.stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  ctx.stream.wait();
}

void set_compute_threads(int threads) {
  EXPAR_CHECK(threads >= 1, "compute threads = {}: must be at least 1", threads);
  omp_set_num_threads(threads);
}

int compute_threads() { return omp_get_max_threads(); }

}  // namespace expar
