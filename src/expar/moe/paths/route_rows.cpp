#include "expar/moe/paths/route_rows.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

namespace {

// Token loops run on the rank's compute threads (OpenMP) when there is enough work: every token's output is
// computed by one thread in the one fixed order, so the thread count never changes a result.
constexpr int64_t kParallelMin = int64_t{1} << 16;  // elements touched

bool parallel_worth(int64_t elements) {
  return elements >= kParallelMin && omp_get_max_threads() > 1;
}

// The valid routes of token t: their rows (and, with w, their weights) in k order. Returns their count.
int valid_rows(const RouteRows& rows, const RouteMap& map, int64_t t, const float** out) {
  int n = 0;
  for (int k = 0; k < map.top_k; ++k)
    if (map.valid(t, k)) out[n++] = rows.row(t, k);
  return n;
}

}  // namespace

RouteRows RouteRows::expert_side(Tensor rows, const RouteMap& map) {
  EXPAR_ASSERT(
      map.ep_size == 1,
      "expert-side rows can be read directly by the source only with an EP group of 1, not {}: an EP path "
      "must bring rows back to the source (RouteRows::gathered)",
      map.ep_size);
  EXPAR_ASSERT(rows.ndim() == 2 && rows.dim(0) >= map.recv_rows,
               "expert-side rows {} hold fewer than {} rows", shape_string(rows.shape()), map.recv_rows);
  RouteRows r;
  r.d_ = rows.dim(1);
  r.rows_ = std::move(rows);
  r.dst_row_ = map.dst_row;
  r.top_k_ = map.top_k;
  return r;
}

RouteRows RouteRows::gathered(Tensor rows, const RouteMap& map) {
  EXPAR_ASSERT(rows.ndim() == 3 && rows.dim(0) == map.tokens && rows.dim(1) == map.top_k,
               "gathered route rows have shape {}, expected [{}, {}, d]", shape_string(rows.shape()),
               map.tokens, map.top_k);
  RouteRows r;
  r.d_ = rows.dim(2);
  r.rows_ = std::move(rows);
  r.dst_row_ = map.dst_row;
  r.top_k_ = map.top_k;
  r.gathered_ = true;
  return r;
}

const float* RouteRows::row(int64_t t, int k) const {
  const float* base = rows_.data<float>();
  if (gathered_) return base + (t * top_k_ + k) * d_;
  return base + static_cast<int64_t>(dst_row_.data<int32_t>()[t * top_k_ + k]) * d_;
}

namespace {

// Adds the routes of one token to its output row, one route at a time in k order, as `out = out + w·row` per
// element (the first route as `0 + w·row`, which is what accumulating into a zeroed row computes, -0
// included), so the rounding (and any contraction of w·row + out the compiler makes) is the same for every
// path and every build. Writing the row instead of zero-filling it first saves a pass over y; the element
// loop is independent across i, so it vectorises without changing any element's order of operations.
void merge_token(const float* const* rows, const float* w, int n, float* out, int64_t d) {
  if (n == 0) {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(d));
    return;
  }
  {
    const float w0 = w[0];
    const float* r = rows[0];
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = 0.0f + w0 * r[i];
  }
  for (int j = 1; j < n; ++j) {
    const float wj = w[j];
    const float* r = rows[j];
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = out[i] + wj * r[i];
  }
}

// The same for the unweighted sum of dispatch backward.
void sum_token(const float* const* rows, int n, float* out, int64_t d) {
  if (n == 0) {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(d));
    return;
  }
  {
    const float* r = rows[0];
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = 0.0f + r[i];
  }
  for (int j = 1; j < n; ++j) {
    const float* r = rows[j];
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = out[i] + r[i];
  }
}

}  // namespace

Tensor merge_routes(const RouteRows& rows, const Tensor& topk_weight, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  const int k_count = map.top_k;
  EXPAR_ASSERT(topk_weight.numel() == t_count * k_count, "topk_weight has shape {}, expected [{}, {}]",
               shape_string(topk_weight.shape()), t_count, k_count);
  Tensor y = Tensor::empty({t_count, d});
  float* out = y.data<float>();
  const float* w = topk_weight.data<float>();
#pragma omp parallel if (parallel_worth(t_count * k_count * d))
  {
    std::vector<const float*> r(static_cast<size_t>(k_count));
    std::vector<float> wk(static_cast<size_t>(k_count));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < t_count; ++t) {
      int n = 0;
      for (int k = 0; k < k_count; ++k)
        if (map.valid(t, k)) {
          r[static_cast<size_t>(n)] = rows.row(t, k);
          wk[static_cast<size_t>(n++)] = w[t * k_count + k];
        }
      merge_token(r.data(), wk.data(), n, out + t * d, d);
    }
  }
  return y;
}

Tensor sum_routes(const RouteRows& rows, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  const int k_count = map.top_k;
  Tensor g = Tensor::empty({t_count, d});
  float* out = g.data<float>();
#pragma omp parallel if (parallel_worth(t_count * k_count * d))
  {
    std::vector<const float*> r(static_cast<size_t>(k_count));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < t_count; ++t)
      sum_token(r.data(), valid_rows(rows, map, t, r.data()), out + t * d, d);
  }
  return g;
}

Tensor sum_route_pointers(const float* const* rows, const RouteMap& map, int64_t d) {
  const int64_t t_count = map.tokens;
  const int k_count = map.top_k;
  Tensor g = Tensor::empty({t_count, d});
  float* out = g.data<float>();
#pragma omp parallel if (parallel_worth(t_count * k_count * d))
  {
    std::vector<const float*> r(static_cast<size_t>(k_count));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < t_count; ++t) {
      int n = 0;
      for (int k = 0; k < k_count; ++k)
        if (map.valid(t, k)) r[static_cast<size_t>(n++)] = rows[t * k_count + k];
      sum_token(r.data(), n, out + t * d, d);
    }
  }
  return g;
}

namespace {

// kChains dot products dot(g[c], r[c]) at once, each accumulated in f64 in element order: the chains are
// independent, so the adds overlap instead of waiting on one another. Each product of two floats is exact
// in f64, so fma(g, r, dot) rounds exactly like dot + g·r.
template <int kChains>
void dots(const float* const* g, const float* const* r, int64_t d, double* out) {
  double acc[kChains] = {};
  for (int64_t i = 0; i < d; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] += static_cast<double>(g[c][i]) * static_cast<double>(r[c][i]);
  for (int c = 0; c < kChains; ++c) out[c] = acc[c];
}

}  // namespace

Tensor route_weight_grads(const Tensor& grad_y, const RouteRows& rows, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  const int k_count = map.top_k;
  EXPAR_ASSERT(grad_y.ndim() == 2 && grad_y.dim(0) == t_count && grad_y.dim(1) == d,
               "grad_y has shape {}, expected [{}, {}]", shape_string(grad_y.shape()), t_count, d);
  Tensor g = Tensor::empty({t_count, k_count});
  float* out = g.data<float>();
  const float* gy = grad_y.data<float>();
  // Routes are taken in blocks of consecutive tokens, kChains valid routes at a time.
  constexpr int kChains = 8;
  constexpr int64_t kBlock = 64;  // tokens per work item
  const int64_t blocks = (t_count + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (parallel_worth(t_count * k_count * d))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t_end = std::min(t_count, (b + 1) * kBlock);
    const float* gp[kChains];
    const float* rp[kChains];
    float* op[kChains];
    double res[kChains];
    int n = 0;
    auto flush = [&](int count) {
      if (count == kChains) {
        dots<kChains>(gp, rp, d, res);
      } else {
        for (int c = 0; c < count; ++c) dots<1>(gp + c, rp + c, d, res + c);
      }
      for (int c = 0; c < count; ++c) *op[c] = static_cast<float>(res[c]);
    };
    for (int64_t t = b * kBlock; t < t_end; ++t)
      for (int k = 0; k < k_count; ++k) {
        float* o = out + t * k_count + k;
        if (!map.valid(t, k)) {
          *o = 0.0f;
          continue;
        }
        gp[n] = gy + t * d;
        rp[n] = rows.row(t, k);
        op[n] = o;
        if (++n == kChains) {
          flush(n);
          n = 0;
        }
      }
    flush(n);
  }
  return g;
}

void weighted_route_grad(const float* grad_y_row, float w, float* out, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) out[i] = w * grad_y_row[i];
}

}  // namespace expar
