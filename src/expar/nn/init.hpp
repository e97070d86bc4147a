#pragma once
// Parameter initialisation by name: the values of a parameter depend only on (seed, name, element index),
// never on the order in which parameters are created or on how they are laid out across ranks.
#include <cstdint>
#include <string_view>

#include "expar/core/tensor.hpp"

namespace expar::nn {

// The RNG stream of a parameter name ("layers.3.attn.wq"): core/rng stream_of.
uint64_t param_stream(std::string_view name);

// t[i] = stddev · N(0, 1) at index first_element + i of the named stream. A shard holding rows [r0, r1) of a
// row-major [R, C] parameter passes first_element = r0·C and gets the same values the full tensor has there.
void init_normal(Tensor& t, uint64_t seed, std::string_view name, float stddev, int64_t first_element = 0);

// Every element = value (RMSNorm gains start at 1).
void init_constant(Tensor& t, float value);

}  // namespace expar::nn
