#include "expar/moe/replica_deal.hpp"

#include "expar/core/assert.hpp"

namespace expar {

void ReplicaDeal::advance(const RouteMap& map, const ExpertPlacement& placement) {
  EXPAR_ASSERT(map.num_experts == placement.num_experts() && map.num_slots == placement.num_slots(),
               "replica deal: a map of {} experts in {} slots under a placement of {} in {}", map.num_experts,
               map.num_slots, placement.num_experts(), placement.num_slots());
  if (!placement.has_replicas()) return;  // one replica each: every deal stays at 0
  starts_.resize(static_cast<size_t>(map.num_experts), 0);
  for (int e = 0; e < map.num_experts; ++e) {
    const std::vector<int>& replicas = placement.expert_slots(e);
    int64_t requested = 0;
    for (int source = 0; source < map.ep_size; ++source)
      for (int slot : replicas) requested += map.requested_of(source, slot);
    int64_t& start = starts_[static_cast<size_t>(e)];
    start = (start + requested) % static_cast<int64_t>(replicas.size());
  }
}

}  // namespace expar
