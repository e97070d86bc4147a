#pragma once
// Reproducible N(0, 1) test operands for the core matrix-product tests: element i of (seed, stream).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "expar/core/rng.hpp"

namespace expar {

inline std::vector<float> random_vector(size_t n, uint64_t seed, uint64_t stream) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = random_normal(seed, stream, i);
  return v;
}

}  // namespace expar
