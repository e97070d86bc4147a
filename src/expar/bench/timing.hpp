#pragma once
// Timing helpers shared by the benchmarks: medians of repeats, and the slowest rank's time of one region.
#include <algorithm>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/timer.hpp"

namespace expar::bench {

// The median of v (the upper one of an even count); 0 when v is empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of the slowest rank for fn, from a world barrier (collective).
template <typename Fn>
double timed_max(Comm& world, Fn&& fn) {
  world.barrier();
  Timer t;
  fn();
  double s = t.seconds();
  world.all_reduce(&s, 1, DType::F64, ReduceOp::Max);
  return s;
}

}  // namespace expar::bench
