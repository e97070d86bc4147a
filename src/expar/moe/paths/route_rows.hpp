#pragma once
// Shared per-route arithmetic of every execution path, so that every path gives BIT-IDENTICAL outputs and
// gradients (contracts 3 and 4 of docs/design.md): a path only decides where the rows come from
// (RouteRows); the sums and products over routes are done here, in one order, in f32.
#include <cstdint>

#include "expar/core/tensor.hpp"
#include "expar/moe/route_map.hpp"

namespace expar {

// Where the row of route (t, k) lives, as seen by its source rank:
//  - expert_side: in an expert-side buffer [capacity_rows, d] of this very rank, at dst_row(t, k)
//    (only when every route's destination is this rank: EP size 1);
//  - gathered: in a [T, K, d] tensor at (t, k) (rows brought back to the source by an EP path).
// Rows of dropped or invalid routes are never read.
class RouteRows {
 public:
  RouteRows() = default;
  static RouteRows expert_side(Tensor rows, const RouteMap& map);
  static RouteRows gathered(Tensor rows, const RouteMap& map);
  bool defined() const { return rows_.defined() && d_ >= 0; }
  int64_t dim() const { return d_; }
  const float* row(int64_t t, int k) const;

 private:
  Tensor rows_;
  Tensor dst_row_;  // shares the route map's storage
  int top_k_ = 0;
  int64_t d_ = -1;
  bool gathered_ = false;
};

// y [T, d]: y[t] = Σ_k w[t,k]·row(t,k) over the valid routes, summed in k order in f32, starting from 0
// (a token whose routes are all dropped gets 0).
Tensor merge_routes(const RouteRows& rows, const Tensor& topk_weight, const RouteMap& map);

// grad_x [T, d]: grad_x[t] = Σ_k row(t,k) over the valid routes in k order in f32 (dispatch backward).
Tensor sum_routes(const RouteRows& rows, const RouteMap& map);

// sum_routes with the row of route (t, k) at rows[t*K + k] (not read for a dropped or invalid route): the
// same order and bits, for a path that reads the rows where they lie (a peer's mapped buffer) instead of
// gathering them into a [T, K, d] tensor first.
Tensor sum_route_pointers(const float* const* rows, const RouteMap& map, int64_t d);

// grad_topk_weight [T, K]: dot(grad_y[t], row(t,k)) (accumulated in f64, in element order), 0 where the
// route is dropped or invalid.
Tensor route_weight_grads(const Tensor& grad_y, const RouteRows& rows, const RouteMap& map);

// out[0, d) = w · grad_y_row[0, d): the expert-output gradient of one route (combine backward).
void weighted_route_grad(const float* grad_y_row, float w, float* out, int64_t d);

}  // namespace expar
