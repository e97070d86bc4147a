#include "expar/moe/paths/route_rows.hpp"

#include <cstring>

#include "expar/core/error.hpp"

namespace expar {

RouteRows RouteRows::expert_side(Tensor rows, const RouteMap& map) {
  EXPAR_CHECK(
      map.ep_size == 1,
      "expert-side rows can be read directly by the source only with an EP group of 1, not {}: an EP path "
      "must bring rows back to the source (RouteRows::gathered)",
      map.ep_size);
  EXPAR_CHECK(rows.ndim() == 2 && rows.dim(0) >= map.recv_rows, "expert-side rows {} hold fewer than {} rows",
              shape_string(rows.shape()), map.recv_rows);
  RouteRows r;
  r.d_ = rows.dim(1);
  r.rows_ = std::move(rows);
  r.dst_row_ = map.dst_row;
  r.top_k_ = map.top_k;
  return r;
}

RouteRows RouteRows::gathered(Tensor rows, const RouteMap& map) {
  EXPAR_CHECK(rows.ndim() == 3 && rows.dim(0) == map.tokens && rows.dim(1) == map.top_k,
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

Tensor merge_routes(const RouteRows& rows, const Tensor& topk_weight, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  const int k_count = map.top_k;
  EXPAR_CHECK(topk_weight.numel() == t_count * k_count, "topk_weight has shape {}, expected [{}, {}]",
              shape_string(topk_weight.shape()), t_count, k_count);
  Tensor y = Tensor::zeros({t_count, d});
  float* out = y.data<float>();
  const float* w = topk_weight.data<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    float* yt = out + t * d;
    for (int k = 0; k < k_count; ++k) {
      if (!map.valid(t, k)) continue;
      const float wk = w[t * k_count + k];
      const float* r = rows.row(t, k);
      for (int64_t i = 0; i < d; ++i) yt[i] += wk * r[i];
    }
  }
  return y;
}

Tensor sum_routes(const RouteRows& rows, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  Tensor g = Tensor::zeros({t_count, d});
  float* out = g.data<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    float* gt = out + t * d;
    for (int k = 0; k < map.top_k; ++k) {
      if (!map.valid(t, k)) continue;
      const float* r = rows.row(t, k);
      for (int64_t i = 0; i < d; ++i) gt[i] += r[i];
    }
  }
  return g;
}

Tensor route_weight_grads(const Tensor& grad_y, const RouteRows& rows, const RouteMap& map) {
  const int64_t t_count = map.tokens, d = rows.dim();
  const int k_count = map.top_k;
  EXPAR_CHECK(grad_y.ndim() == 2 && grad_y.dim(0) == t_count && grad_y.dim(1) == d,
              "grad_y has shape {}, expected [{}, {}]", shape_string(grad_y.shape()), t_count, d);
  Tensor g = Tensor::empty({t_count, k_count});
  float* out = g.data<float>();
  const float* gy = grad_y.data<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    for (int k = 0; k < k_count; ++k) {
      double dot = 0.0;
      if (map.valid(t, k)) {
        const float* r = rows.row(t, k);
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(gy[t * d + i]) * r[i];
      }
      out[t * k_count + k] = static_cast<float>(dot);
    }
  }
  return g;
}

void weighted_route_grad(const float* grad_y_row, float w, float* out, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = w * grad_y_row[i];
}

}  // namespace expar
