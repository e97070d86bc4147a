#include "expar/train/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/bf16_round.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

namespace {

// One parameter's elements to update: its values, gradients and moments, and its BF16 copy or null.
struct Update {
  float* __restrict w;
  const float* __restrict g;
  float* __restrict m;
  float* __restrict v;
  uint16_t* __restrict copy;
  int64_t n;
};
struct UpdateFactors {
  double clip, lr, eps, bias1, bias2;
  float b1, b2, decay;
};

// The AdamW update of every element (adamw.hpp), each rounded into the BF16 copy as it is written when
// `with_copy`. The element formulas are independent, so the loop vectorises with the same bits per element.
template <bool with_copy>
void update(const Update& u, const UpdateFactors& f) {
  float* __restrict w = u.w;
  const float* __restrict g = u.g;
  float* __restrict m = u.m;
  float* __restrict v = u.v;
  uint16_t* __restrict copy = u.copy;
  const float b1 = f.b1, b2 = f.b2, decay = f.decay;
  const double clip = f.clip, lr = f.lr, eps = f.eps, bias1 = f.bias1, bias2 = f.bias2;
#pragma omp simd
  for (int64_t j = 0; j < u.n; ++j) {
    const float gj = static_cast<float>(g[j] * clip);
    const float mj = b1 * m[j] + (1.0f - b1) * gj;
    const float vj = b2 * v[j] + (1.0f - b2) * gj * gj;
    m[j] = mj;
    v[j] = vj;
    const double mhat = mj / bias1, vhat = vj / bias2;
    float wj = w[j];
    wj -= decay * wj;
    wj -= static_cast<float>(lr * mhat / (std::sqrt(vhat) + eps));
    w[j] = wj;
    if constexpr (with_copy) copy[j] = round_to_bf16(wj);
  }
}

// Σ x² of each array in `arrays`, into sums[k]: each a sequential chain of double additions in element order,
// the bits of that array summed alone. A chain waits on each of its additions, so one array after another the
// global gradient norm ran at that latency; here kChains arrays of similar lengths (the arrays sorted by
// length) run interleaved up to the shortest one's length, each then finished alone.
constexpr size_t kChains = 4;
void sums_of_squares(const std::vector<std::span<const float>>& arrays, double* sums) {
  std::vector<size_t> order(arrays.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return arrays[a].size() < arrays[b].size(); });
  for (size_t first = 0; first < order.size(); first += kChains) {
    const size_t count = std::min(kChains, order.size() - first);
    const float* p[kChains] = {};
    double s[kChains] = {};
    for (size_t k = 0; k < count; ++k) p[k] = arrays[order[first + k]].data();
    // Sorted by length: the group's first array is its shortest.
    const size_t common = count == kChains ? arrays[order[first]].size() : 0;
    for (size_t i = 0; i < common; ++i)
      for (size_t k = 0; k < kChains; ++k) s[k] += static_cast<double>(p[k][i]) * p[k][i];
    for (size_t k = 0; k < count; ++k) {
      const size_t n = arrays[order[first + k]].size();
      for (size_t i = common; i < n; ++i) s[k] += static_cast<double>(p[k][i]) * p[k][i];
      sums[order[first + k]] = s[k];
    }
  }
}

}  // namespace

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
  // Each parameter's sum of squares is one chain in element order, over the rows it counts (norm_rows);
  // they are added into the dense and expert sums in parameter order. Parameters that count every row are
  // summed several at once (sums_of_squares: the same bits).
  std::vector<double> sq(params_.size(), 0.0);
  std::vector<std::span<const float>> whole;
  std::vector<size_t> whole_of;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Parameter* p = params_[k];
    const float* g = p->grad.data<float>();
    const int64_t n = p->grad.numel();
    const auto rows = static_cast<int64_t>(p->norm_rows.size());
    EXPAR_CHECK(rows == 0 || (p->grad.ndim() >= 1 && p->grad.dim(0) == rows),
                "parameter '{}': {} norm rows for a gradient of shape {}", p->name, rows,
                shape_string(p->grad.shape()));
    if (rows == 0) {
      whole.emplace_back(g, static_cast<size_t>(n));
      whole_of.push_back(k);
      continue;
    }
    const int64_t per_row = n / rows;
    for (int64_t r = 0; r < rows; ++r)
      if (p->norm_rows[static_cast<size_t>(r)])
        for (int64_t i = r * per_row; i < (r + 1) * per_row; ++i) sq[k] += static_cast<double>(g[i]) * g[i];
  }
  std::vector<double> whole_sq(whole.size());
  sums_of_squares(whole, whole_sq.data());
  for (size_t w = 0; w < whole.size(); ++w) sq[whole_of[w]] = whole_sq[w];
  double dense_sq = 0.0, expert_sq = 0.0;
  for (size_t k = 0; k < params_.size(); ++k)
    (params_[k]->kind == ParamKind::Dense ? dense_sq : expert_sq) += sq[k];
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
    const bool sharded = s.end - s.begin != p->value.numel();
    uint16_t* copy = nullptr;
    if (p->bf16_copy.defined()) {
      EXPAR_ASSERT(p->bf16_copy.dtype() == DType::BF16 && p->bf16_copy.numel() == p->value.numel(),
                   "parameter '{}': its BF16 copy is {} {}, not BF16 of its {} values", p->name,
                   dtype_name(p->bf16_copy.dtype()), shape_string(p->bf16_copy.shape()), p->value.numel());
      copy = static_cast<uint16_t*>(p->bf16_copy.raw());
    }
    const Update u{.w = p->value.data<float>() + s.begin,
                   .g = p->grad.data<float>() + s.begin,
                   .m = s.m.data<float>(),
                   .v = s.v.data<float>(),
                   .copy = sharded || copy == nullptr ? nullptr : copy + s.begin,
                   .n = s.end - s.begin};
    const UpdateFactors f{.clip = clip,
                          .lr = lr,
                          .eps = config_.eps,
                          .bias1 = bias1,
                          .bias2 = bias2,
                          .b1 = b1,
                          .b2 = b2,
                          .decay = p->weight_decay ? static_cast<float>(lr * config_.weight_decay) : 0.0f};
    if (u.copy)
      update<true>(u, f);
    else
      update<false>(u, f);
    if (sharded) {
      // Sharded expert state: gather every member's updated slice.
      int parts = ep_dp_.size();
      int64_t n = p->value.numel();
      std::vector<size_t> counts(static_cast<size_t>(parts));
      for (int r = 0; r < parts; ++r)
        counts[static_cast<size_t>(r)] = static_cast<size_t>(n * (r + 1) / parts - n * r / parts);
      Tensor slice = p->value.reshape({n}).rows(s.begin, s.end).clone(MemCategory::CommScratch);
      float* w = p->value.data<float>();
      ep_dp_.all_gather_v(slice.raw(), static_cast<size_t>(slice.numel()), w, counts, DType::F32);
      if (copy) round_rows_to_bf16(w, n, copy, n, 1, n);
    }
  }
  return norm;
}

}  // namespace expar
