#include "expar/comm/comm.hpp"

#include "expar/core/error.hpp"

namespace expar {

std::shared_ptr<Comm> Comm::subgroup(const std::vector<std::vector<int>>& partition, const std::string& name) {
  std::vector<int> seen(static_cast<size_t>(size()), 0);
  int color = -1, key = -1;
  for (size_t g = 0; g < partition.size(); ++g) {
    for (size_t i = 0; i < partition[g].size(); ++i) {
      int r = partition[g][i];
      EXPAR_CHECK(r >= 0 && r < size(), "subgroup '{}': rank {} is outside the parent group of size {}", name, r,
                  size());
      EXPAR_CHECK(seen[static_cast<size_t>(r)]++ == 0,
                  "subgroup '{}': rank {} appears in more than one group; the groups must partition the parent",
                  name, r);
      if (r == rank()) {
        color = static_cast<int>(g);
        key = static_cast<int>(i);
      }
    }
  }
  EXPAR_CHECK(color >= 0, "subgroup '{}': rank {} is in none of the groups; the groups must partition the parent",
              name, rank());
  return split(color, key, name);
}

}  // namespace expar
