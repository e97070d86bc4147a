#pragma once
// Learning rate: linear warmup from 0 to peak over `warmup` steps, then cosine decay to `min_ratio`·peak at
// `total` steps (constant after).
#include <cmath>

namespace expar {

struct LrSchedule {
  double peak = 3e-3;
  double min_ratio = 0.1;
  int warmup = 20;
  int total = 200;

  double at(int step) const {
    if (warmup > 0 && step < warmup) return peak * (step + 1) / warmup;
    if (step >= total) return peak * min_ratio;
    double progress = static_cast<double>(step - warmup) / std::max(1, total - warmup);
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
  }
};

}  // namespace expar
