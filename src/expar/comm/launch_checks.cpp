#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"

namespace expar {

void check_emulated_nodes(int ranks_per_node, int ranks, const std::string& transport) {
  EXPAR_CHECK(
      ranks_per_node == 0 || transport == "threads",
      "--ranks-per-node {} with --transport {}: MPI finds the real nodes of its ranks; emulated nodes are "
      "for the threads transport (run under scripts/mpirun-nodes for nodes of processes)",
      ranks_per_node, transport);
  EXPAR_CHECK(ranks_per_node >= 0 && (ranks_per_node == 0 || ranks % ranks_per_node == 0),
              "--ranks-per-node {} does not divide --ranks {}: every emulated node holds the same number of "
              "ranks; choose a divisor of {}",
              ranks_per_node, ranks, ranks);
}

}  // namespace expar
