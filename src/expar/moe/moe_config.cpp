#include "expar/moe/moe_config.hpp"

#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar {

RouterConfig MoeConfig::router() const {
  RouterConfig r;
  r.num_experts = num_experts;
  r.top_k = top_k;
  r.score = score;
  r.renormalize = renormalize;
  r.softmax_over_topk = softmax_over_topk;
  r.n_group = n_group;
  r.topk_group = topk_group;
  r.aux_loss_coef = aux_loss_coef;
  r.z_loss_coef = z_loss_coef;
  return r;
}

void MoeConfig::validate(int ep_size) const {
  router().validate();
  EXPAR_CHECK(model_dim >= 1, "model_dim={} must be at least 1", model_dim);
  EXPAR_CHECK(hidden_dim >= 1, "hidden_dim={} (expert MLP width) must be at least 1", hidden_dim);
  capacity.validate();
  precision.validate(model_dim);
  ExpertPlacement check(num_experts, ep_size, placement);  // throws for E not divisible by the EP degree
  waves.validate(check.local_count());
  EXPAR_CHECK(waves.waves == 1 || path_traits(path).waves,
              "path '{}' has no wave schedule (--waves {}): pass --waves 1, or choose path {}", path,
              waves.waves, paths_with(&PathTraits::waves));
}

}  // namespace expar
