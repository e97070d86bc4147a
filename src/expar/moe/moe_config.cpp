#include "expar/moe/moe_config.hpp"

#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar {

void MoeConfig::validate() const {
  router.validate();
  EXPAR_CHECK(model_dim >= 1, "model_dim={} must be at least 1", model_dim);
  EXPAR_CHECK(hidden_dim >= 1, "hidden_dim={} (expert MLP width) must be at least 1", hidden_dim);
}

void MoeExecution::validate(const MoeConfig& block, int ep_size) const {
  capacity.validate();
  precision.validate(block.model_dim);
  const ExpertPlacement check = expert_placement(block.router.num_experts, ep_size);  // throws: S % EP != 0
  waves.validate(check.local_count());
  EXPAR_CHECK(waves.waves == 1 || path_traits(path).waves,
              "path '{}' has no wave schedule (--waves {}): pass --waves 1, or choose path {}", path,
              waves.waves, paths_with(&PathTraits::waves));
}

ExpertPlacement MoeExecution::expert_placement(int num_experts, int ep_size) const {
  if (slots.empty()) return ExpertPlacement(num_experts, ep_size, placement);
  return ExpertPlacement::from_slots(num_experts, ep_size, slots);
}

}  // namespace expar
