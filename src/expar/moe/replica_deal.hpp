#pragma once
// The replica rule's position between route maps (issue #36; route_map.hpp, "Replica rule"). A map deals the
// group's routes to a replicated expert e over its n_e replicas in turn; a ReplicaDeal remembers where that
// deal stopped, so the next map of the same MoE layer continues it. Without it every map starts at e's first
// replica, and a step that sends one route to e (batch-1 decode) always sends it there.
//
// The deal moves on by the group's requests to e in each map, which every rank of the group knows from the
// same gathered request matrix: ranks that build the same maps from the same start keep the same deal with
// no message. Its owner keeps one per MoE layer and resets it when the placement changes (n_e and the slots
// change with it).
#include <cstdint>
#include <span>
#include <vector>

#include "expar/moe/route_map.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class ReplicaDeal {
 public:
  // Per logical expert, the replica (in [0, n_e)) the group's next route to it goes to; empty before the
  // first map with replicas (every deal at replica 0). What build_route_map takes as replica_starts.
  std::span<const int64_t> starts() const { return starts_; }
  // After `map` was built with starts() under `placement`: each expert's deal moves on by the group's
  // requests to it in the map (before capacity: the deal counts requests, as slot_requests does).
  void advance(const RouteMap& map, const ExpertPlacement& placement);
  // Every deal back to replica 0.
  void reset() { starts_.clear(); }

 private:
  std::vector<int64_t> starts_;
};

}  // namespace expar
