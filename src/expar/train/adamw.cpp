#include "expar/train/adamw.hpp"

#include <cmath>
#include <vector>

#include "expar/core/error.hpp"

namespace expar {

AdamW::AdamW(std::vector<Parameter*> params, AdamWConfig config, Comm& ep_mp, Comm& ep_dp)
    : params_(std::move(params)), config_(config), ep_mp_(ep_mp), ep_dp_(ep_dp) {
  for (Parameter* p : params_) {
    State s;
    int64_t n = p->value.numel();
    s.begin = 0;
    s.end = n;
    if (config_.shard_expert_state && p->kind == ParamKind::Expert) {
      int64_t parts = ep_dp_.size(), j = ep_dp_.rank();
      s.begin = n * j / parts;
      s.end = n * (j + 1) / parts;
    }
    s.m = Tensor::zeros({s.end - s.begin}, DType::F32, MemCategory::OptimizerState);
    s.v = Tensor::zeros({s.end - s.begin}, DType::F32, MemCategory::OptimizerState);
    state_.push_back(std::move(s));
  }
}

double AdamW::global_grad_norm() {
  double dense_sq = 0.0, expert_sq = 0.0;
  for (Parameter* p : params_) {
    const float* g = p->grad.data<float>();
    const int64_t n = p->grad.numel();
    const auto rows = static_cast<int64_t>(p->norm_rows.size());
    EXPAR_CHECK(rows == 0 || (p->grad.ndim() >= 1 && p->grad.dim(0) == rows),
                "parameter '{}': {} norm rows for a gradient of shape {}", p->name, rows,
                shape_string(p->grad.shape()));
    const int64_t per_row = rows == 0 ? n : n / rows;
    double sq = 0.0;
    for (int64_t i = 0; i < n; ++i)
      if (rows == 0 || p->norm_rows[static_cast<size_t>(i / per_row)]) sq += static_cast<double>(g[i]) * g[i];
    (p->kind == ParamKind::Dense ? dense_sq : expert_sq) += sq;
  }
  ep_mp_.all_reduce(&expert_sq, 1, DType::F64, ReduceOp::Sum);
  return std::sqrt(dense_sq + expert_sq);
}

double AdamW::step(double lr) {
  double norm = global_grad_norm();
  double clip = 1.0;
  if (config_.clip_norm > 0 && norm > config_.clip_norm) clip = config_.clip_norm / (norm + 1e-6);
  ++steps_;
  const double bias1 = 1.0 - std::pow(config_.beta1, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(config_.beta2, static_cast<double>(steps_));
  const auto b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    State& s = state_[i];
    float* w = p->value.data<float>();
    const float* g = p->grad.data<float>();
    float* m = s.m.data<float>();
    float* v = s.v.data<float>();
    const float decay = p->weight_decay ? static_cast<float>(lr * config_.weight_decay) : 0.0f;
    for (int64_t j = s.begin; j < s.end; ++j) {
      float gj = static_cast<float>(g[j] * clip);
      float& mj = m[j - s.begin];
      float& vj = v[j - s.begin];
      mj = b1 * mj + (1.0f - b1) * gj;
      vj = b2 * vj + (1.0f - b2) * gj * gj;
      double mhat = mj / bias1, vhat = vj / bias2;
      w[j] -= decay * w[j];
      w[j] -= static_cast<float>(lr * mhat / (std::sqrt(vhat) + config_.eps));
    }
    if (s.end - s.begin != p->value.numel()) {
      // Sharded expert state: gather every member's updated slice.
      int parts = ep_dp_.size();
      int64_t n = p->value.numel();
      std::vector<size_t> counts(static_cast<size_t>(parts));
      for (int r = 0; r < parts; ++r)
        counts[static_cast<size_t>(r)] = static_cast<size_t>(n * (r + 1) / parts - n * r / parts);
      Tensor slice = p->value.reshape({n}).rows(s.begin, s.end).clone(MemCategory::CommScratch);
      ep_dp_.all_gather_v(slice.raw(), static_cast<size_t>(slice.numel()), w, counts, DType::F32);
    }
  }
  return norm;
}

}  // namespace expar
