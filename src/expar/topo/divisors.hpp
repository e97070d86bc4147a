#pragma once
// Divisors of n, ascending: the "valid choices" that layout error messages list.
#include <vector>

namespace expar {

inline std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace expar
