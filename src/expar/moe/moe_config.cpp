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
  ExpertPlacement check(block.router.num_experts, ep_size, placement);  // throws for E not divisible by EP
  waves.validate(check.local_count());
  EXPAR_CHECK(waves.waves == 1 || path_traits(path).waves,
              "path '{}' has no wave schedule (--waves {}): pass --waves 1, or choose path {}", path,
              waves.waves, paths_with(&PathTraits::waves));
}

}  // namespace expar
