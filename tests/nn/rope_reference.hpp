#pragma once
// An independent double-precision statement of the rope types of transformers' modeling_rope_utils (default,
// linear, YaRN, llama3): the frequency of pair i of a head and the cos/sin scale. The tests of nn::Rope and
// the dense references of tests/infer use it.
#include <algorithm>
#include <cmath>

#include "expar/nn/rope.hpp"

namespace expar::nn::testing {

// The rope types of transformers' modeling_rope_utils, written out independently in double: the frequency
// of pair i and the cos/sin scale.
struct ReferenceRope {
  RopeScaling s;
  double frequency(int64_t i, int64_t hd) const {
    const double base = 1.0 / std::pow(s.theta, static_cast<double>(2 * i) / static_cast<double>(hd));
    const double pi = 3.14159265358979323846;
    if (s.type == RopeType::Linear) return base / s.factor;
    if (s.type == RopeType::Llama3) {
      const double wavelength = 2 * pi / base, ctx = static_cast<double>(s.original_max_position_embeddings);
      if (wavelength < ctx / s.high_freq_factor) return base;
      if (wavelength > ctx / s.low_freq_factor) return base / s.factor;
      const double t = (ctx / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return t * base + (1 - t) * base / s.factor;
    }
    if (s.type == RopeType::Yarn) {
      // The dimension index at which a pair completes r rotations over the original context.
      auto dim_of = [&](double r) {
        return static_cast<double>(hd) *
               std::log(static_cast<double>(s.original_max_position_embeddings) / (2 * pi * r)) /
               (2 * std::log(s.theta));
      };
      double lo = dim_of(s.beta_fast), hi = dim_of(s.beta_slow);
      if (s.truncate) lo = std::floor(lo), hi = std::ceil(hi);
      lo = std::max(0.0, lo);
      hi = std::min(static_cast<double>(hd - 1), hi);
      if (hi == lo) hi += 0.001;
      double interpolated_share = (static_cast<double>(i) - lo) / (hi - lo);
      interpolated_share = interpolated_share < 0 ? 0 : interpolated_share > 1 ? 1 : interpolated_share;
      return interpolated_share * base / s.factor + (1 - interpolated_share) * base;
    }
    return base;
  }
  double scale() const {
    if (s.type != RopeType::Yarn) return 1;
    if (s.attention_factor > 0) return s.attention_factor;
    return s.factor > 1 ? 1 + 0.1 * std::log(s.factor) : 1;
  }
};

}  // namespace expar::nn::testing
