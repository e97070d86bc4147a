#pragma once
// Test data every rank can generate for every rank (core/rng.hpp), so each rank checks its own result of a
// collective against a local computation. Shared by the threads and MPI tests.
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "expar/core/rng.hpp"

namespace expar::testing {

constexpr uint64_t kSeed = 20240611;

// Element i of rank r's contribution number `use`. Floats are spread over [-1, 1) with many mantissa bits,
// so a change of summation order shows up in the last bits; integers are small so sums stay exact.
template <typename T>
T value_of(int rank, size_t i, uint64_t use) {
  const uint32_t u = random_u32(kSeed, use * 1024 + static_cast<uint64_t>(rank), i);
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<double>(u) / 4294967296.0 * 2.0 - 1.0) / static_cast<T>(3);
  } else {
    return static_cast<T>(static_cast<int64_t>(u % 20001) - 10000);
  }
}

template <typename T>
std::vector<T> values_of(int rank, size_t count, uint64_t use, size_t first = 0) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value_of<T>(rank, first + i, use);
  return v;
}

// Uneven split lists with zeros: how many elements member `from` sends to member `to` in a group of n.
inline size_t uneven_count(int from, int to, int n, uint64_t use) {
  return (static_cast<size_t>(from) * 5 + static_cast<size_t>(to) * 3 + static_cast<size_t>(n) + use) % 4;
}

}  // namespace expar::testing
