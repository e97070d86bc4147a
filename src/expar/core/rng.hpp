#pragma once
// Counter-based random numbers (Philox4x32-10): the value at (seed, stream, index) is a pure function of
// those three numbers, so any rank, with any number of threads or ranks, can generate any element of any
// other rank's data. Streams separate independent uses (one per parameter, per data source, ...).
#include <array>
#include <cstdint>

#include "expar/core/tensor.hpp"

namespace expar {

std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> counter);

uint32_t random_u32(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform in [0, 1), 24 random bits.
float random_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller over the two first words of the block).
float random_normal(uint64_t seed, uint64_t stream, uint64_t index);

// Fill element i of `t` (f32) with the value at index offset + i.
void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float low, float high, uint64_t offset = 0);
void fill_normal(Tensor& t, uint64_t seed, uint64_t stream, float stddev, uint64_t offset = 0);

// Stable stream id for a name ("layers.3.attn.wq"), so parameter init does not depend on creation order.
uint64_t stream_of(const char* name);

}  // namespace expar
