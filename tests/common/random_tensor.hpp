#pragma once
// Deterministic random tensors of the tests: normal values from the counter-based generator of core/rng, so a
// tensor depends only on (seed, stream), not on what other tests drew before.
#include <cstdint>
#include <utility>

#include "expar/core/rng.hpp"
#include "expar/core/tensor.hpp"

namespace expar::test {

constexpr uint64_t kRandnSeed = 1234;

// An f32 tensor of N(0, stddev²) values, stream `stream` of `seed`.
inline Tensor randn(Shape shape, uint64_t stream, float stddev = 1.0f, uint64_t seed = kRandnSeed) {
  Tensor t = Tensor::empty(std::move(shape));
  fill_normal(t, seed, stream, stddev);
  return t;
}

}  // namespace expar::test
