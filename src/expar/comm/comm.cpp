#include "expar/comm/comm.hpp"

#include <algorithm>
#include <map>

#include "expar/core/error.hpp"

namespace expar {

NodeMap NodeMap::from_labels(std::span<const int64_t> labels) {
  NodeMap map;
  std::map<int64_t, int> ids;
  for (int64_t label : labels) {
    auto [it, fresh] = ids.try_emplace(label, static_cast<int>(ids.size()));
    map.node_of.push_back(it->second);
  }
  map.num_nodes = std::max<int>(1, static_cast<int>(ids.size()));
  return map;
}

void Comm::count_send_to_each_peer(size_t bytes) {
  for (int m = 0; m < size(); ++m)
    if (m != rank() && bytes > 0) {
      stats_.bytes_sent += static_cast<int64_t>(bytes);
      stats_.traffic.add(nodes_.across(rank(), m), bytes);
    }
}

void Comm::count_sends(std::span<const size_t> counts, size_t esize) {
  for (size_t m = 0; m < counts.size(); ++m)
    if (static_cast<int>(m) != rank() && counts[m] > 0) {
      stats_.bytes_sent += static_cast<int64_t>(counts[m] * esize);
      stats_.traffic.add(nodes_.across(rank(), static_cast<int>(m)), counts[m] * esize);
    }
}

std::shared_ptr<Comm> Comm::subgroup(const std::vector<std::vector<int>>& partition,
                                     const std::string& name) {
  std::vector<int> seen(static_cast<size_t>(size()), 0);
  int color = -1, key = -1;
  for (size_t g = 0; g < partition.size(); ++g) {
    for (size_t i = 0; i < partition[g].size(); ++i) {
      int r = partition[g][i];
      EXPAR_CHECK(r >= 0 && r < size(), "subgroup '{}': rank {} is outside the parent group of size {}", name,
                  r, size());
      EXPAR_CHECK(
          seen[static_cast<size_t>(r)]++ == 0,
          "subgroup '{}': rank {} appears in more than one group; the groups must partition the parent", name,
          r);
      if (r == rank()) {
        color = static_cast<int>(g);
        key = static_cast<int>(i);
      }
    }
  }
  EXPAR_CHECK(color >= 0,
              "subgroup '{}': rank {} is in none of the groups; the groups must partition the parent", name,
              rank());
  return split(color, key, name);
}

}  // namespace expar
