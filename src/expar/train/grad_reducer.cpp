#include "expar/train/grad_reducer.hpp"

#include <algorithm>
#include <cstring>

namespace expar {

GradReducer::GradReducer(std::vector<Parameter*> params, Comm& dense_dp, Comm& ep_dp, size_t bucket_bytes,
                         int dense_world)
    : params_(std::move(params)),
      dense_dp_(dense_dp),
      ep_dp_(ep_dp),
      scale_(1.0f / static_cast<float>(dense_world)) {
  EXPAR_CHECK(bucket_bytes >= sizeof(float), "bucket size {} B is too small: use at least 4 bytes",
              bucket_bytes);
  EXPAR_CHECK(dense_world >= 1, "dense data-parallel world {} must be >= 1", dense_world);
  const size_t bucket_elems = bucket_bytes / sizeof(float);
  size_t largest = 0;
  for (ParamKind kind : {ParamKind::Dense, ParamKind::Expert}) {
    Bucket current{kind, {}, 0};
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i]->kind != kind) continue;
      auto n = static_cast<size_t>(params_[i]->grad.numel());
      if (!current.members.empty() && current.elements + n > bucket_elems) {
        buckets_.push_back(current);
        current = Bucket{kind, {}, 0};
      }
      current.members.push_back(i);
      current.elements += n;
    }
    if (!current.members.empty()) buckets_.push_back(current);
  }
  for (auto& b : buckets_) largest = std::max(largest, b.elements);
  flat_ = Tensor::empty({static_cast<int64_t>(largest)}, DType::F32, MemCategory::CommScratch);
}

void GradReducer::reduce() {
  float* flat = flat_.data<float>();
  for (auto& b : buckets_) {
    size_t at = 0;
    for (size_t i : b.members) {
      auto& g = params_[i]->grad;
      std::memcpy(flat + at, g.raw(), g.nbytes());
      at += static_cast<size_t>(g.numel());
    }
    Comm& group = b.kind == ParamKind::Dense ? dense_dp_ : ep_dp_;
    group.all_reduce(flat, b.elements, DType::F32, ReduceOp::Sum);
    at = 0;
    for (size_t i : b.members) {
      auto& g = params_[i]->grad;
      float* dst = g.data<float>();
      // numel() once (it is out of line), so that the loop vectorises.
      const int64_t n = g.numel();
      for (int64_t j = 0; j < n; ++j) dst[j] = flat[at + static_cast<size_t>(j)] * scale_;
      at += static_cast<size_t>(n);
    }
  }
}

}  // namespace expar
