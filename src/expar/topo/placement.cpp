#include "expar/topo/placement.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/divisors.hpp"

namespace expar {

PlacementKind placement_from_name(const std::string& name) {
  if (name == "contiguous") return PlacementKind::Contiguous;
  if (name == "round-robin" || name == "round_robin") return PlacementKind::RoundRobin;
  fail("expert placement '{}' is unknown: use one of {}", name, fmt::join(placement_names(), ", "));
}

std::string placement_name(PlacementKind kind) {
  return kind == PlacementKind::Contiguous ? "contiguous" : "round-robin";
}

std::vector<std::string> placement_names() {
  return {placement_name(PlacementKind::Contiguous), placement_name(PlacementKind::RoundRobin)};
}

ExpertPlacement::ExpertPlacement(int num_experts, int ep_size, PlacementKind kind)
    : num_experts_(num_experts), ep_size_(ep_size), kind_(kind) {
  EXPAR_CHECK(num_experts >= 1, "num_experts={} must be at least 1", num_experts);
  EXPAR_CHECK(ep_size >= 1, "EP degree={} must be at least 1", ep_size);
  EXPAR_CHECK(num_experts % ep_size == 0,
              "num_experts={} is not divisible by EP degree={}: choose the EP degree in {{{}}}", num_experts,
              ep_size, fmt::join(divisors(num_experts), ","));
}

int ExpertPlacement::owner(int e) const {
  EXPAR_ASSERT(e >= 0 && e < num_experts_, "expert {} is out of range [0, {})", e, num_experts_);
  return kind_ == PlacementKind::Contiguous ? e / local_count() : e % ep_size_;
}

int ExpertPlacement::local_index(int e) const {
  EXPAR_ASSERT(e >= 0 && e < num_experts_, "expert {} is out of range [0, {})", e, num_experts_);
  return kind_ == PlacementKind::Contiguous ? e % local_count() : e / ep_size_;
}

int ExpertPlacement::global_expert(int ep_rank, int local) const {
  EXPAR_ASSERT(ep_rank >= 0 && ep_rank < ep_size_ && local >= 0 && local < local_count(),
               "EP rank {} / local expert {} out of range ({} ranks x {} local experts)", ep_rank, local,
               ep_size_, local_count());
  return kind_ == PlacementKind::Contiguous ? ep_rank * local_count() + local : local * ep_size_ + ep_rank;
}

std::vector<int> ExpertPlacement::local_experts(int ep_rank) const {
  std::vector<int> out;
  for (int l = 0; l < local_count(); ++l) out.push_back(global_expert(ep_rank, l));
  return out;
}

std::vector<int> ExpertPlacement::global_to_local(int ep_rank) const {
  std::vector<int> map(static_cast<size_t>(num_experts_), -1);
  for (int l = 0; l < local_count(); ++l) map[static_cast<size_t>(global_expert(ep_rank, l))] = l;
  return map;
}

}  // namespace expar
