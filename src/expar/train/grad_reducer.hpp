#pragma once
// The multi-group gradient reducer (seed 000 §5.1, "Dense and expert parameters use different reduction
// groups"): dense gradients are summed over the dense data-parallel group, routed-expert gradients over
// EP_DP (the ranks that hold copies of the same expert shard). Gradients are packed into flat buckets of at
// most `bucket_bytes` (a larger tensor gets a bucket of its own); a bucket never mixes reduction groups.
// Both kinds are scaled by 1/D so the result equals what plain data parallelism over all D ranks computes
// when each rank's loss is the mean over its own tokens: an expert shard's local gradient already holds
// the contributions of every token of its EP_MP group, so summing over EP_DP covers all D ranks' tokens once.
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/parameter.hpp"

namespace expar {

class GradReducer {
 public:
  GradReducer(std::vector<Parameter*> params, Comm& dense_dp, Comm& ep_dp, size_t bucket_bytes,
              int dense_world);

  // Sum and scale every gradient over its group. Call once per optimizer step, after the last
  // microbatch's backward (gradient accumulation needs no reduction before that).
  void reduce();

  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // Parameter indices of bucket b (for tests: a bucket never mixes kinds).
  const std::vector<size_t>& bucket(int b) const { return buckets_[static_cast<size_t>(b)].members; }
  ParamKind bucket_kind(int b) const { return buckets_[static_cast<size_t>(b)].kind; }

 private:
  struct Bucket {
    ParamKind kind;
    std::vector<size_t> members;
    size_t elements = 0;
  };
  std::vector<Parameter*> params_;
  Comm& dense_dp_;
  Comm& ep_dp_;
  std::vector<Bucket> buckets_;
  Tensor flat_;
  float scale_;
};

}  // namespace expar
