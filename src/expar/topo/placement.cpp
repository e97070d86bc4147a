#include "expar/topo/placement.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/divisors.hpp"
#include "expar/topo/expert_balance.hpp"

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
              "num_experts={} is not divisible by EP degree={}: choose the EP degree in {{{}}}, or add "
              "redundant expert slots so that the slots divide it",
              num_experts, ep_size, fmt::join(divisors(num_experts), ","));
  slot_expert_.resize(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) slot_expert_[static_cast<size_t>(e)] = e;
  index_slots();
}

ExpertPlacement ExpertPlacement::from_slots(int num_experts, int ep_size, std::vector<int> slot_experts) {
  EXPAR_CHECK(num_experts >= 1, "num_experts={} must be at least 1", num_experts);
  EXPAR_CHECK(ep_size >= 1, "EP degree={} must be at least 1", ep_size);
  const auto s_count = static_cast<int>(slot_experts.size());
  EXPAR_CHECK(s_count >= num_experts,
              "{} expert slots cannot hold {} experts: give every expert at least one slot (S = E + R with "
              "R >= 0 redundant slots)",
              s_count, num_experts);
  EXPAR_CHECK(s_count % ep_size == 0,
              "{} expert slots ({} experts + {} redundant) are not divisible by EP degree={}: every rank "
              "holds the same number of slots, so choose R with (E + R) % {} == 0 (R = {} is the next)",
              s_count, num_experts, s_count - num_experts, ep_size, ep_size,
              s_count - num_experts + (ep_size - s_count % ep_size));
  std::vector<int> count(static_cast<size_t>(num_experts), 0);
  for (int s = 0; s < s_count; ++s) {
    const int e = slot_experts[static_cast<size_t>(s)];
    EXPAR_CHECK(e >= 0 && e < num_experts,
                "expert slot {} names expert {}, which does not exist: slots hold experts in [0, {})", s, e,
                num_experts);
    ++count[static_cast<size_t>(e)];
  }
  for (int e = 0; e < num_experts; ++e)
    EXPAR_CHECK(count[static_cast<size_t>(e)] > 0,
                "expert {} has no slot: every logical expert needs at least one of the {} slots (replace a "
                "second replica of another expert by it)",
                e, s_count);
  ExpertPlacement p;
  p.num_experts_ = num_experts;
  p.ep_size_ = ep_size;
  p.kind_ = PlacementKind::Contiguous;
  p.explicit_ = true;
  p.slot_expert_ = std::move(slot_experts);
  p.index_slots();
  return p;
}

ExpertPlacement ExpertPlacement::from_balance(const ExpertBalance& b) {
  std::vector<int> slot_experts;
  slot_experts.reserve(b.slots.size());
  for (size_t s = 0; s < b.slots.size(); ++s) {
    EXPAR_ASSERT(b.slots_per_rank > 0 && b.slots[s].rank == static_cast<int>(s) / b.slots_per_rank,
                 "expert balance: slot {} is on rank {}, not rank-major ({} slots per rank)", s,
                 b.slots[s].rank, b.slots_per_rank);
    slot_experts.push_back(b.slots[s].expert);
  }
  return from_slots(b.num_experts, b.ep_size, std::move(slot_experts));
}

void ExpertPlacement::index_slots() {
  const int s_count = num_slots(), per_rank = local_count();
  slot_rank_.assign(static_cast<size_t>(s_count), 0);
  slot_local_.assign(static_cast<size_t>(s_count), 0);
  rank_slots_.assign(static_cast<size_t>(s_count), 0);
  expert_slots_.assign(static_cast<size_t>(num_experts_), {});
  for (int s = 0; s < s_count; ++s) {
    int rank = s / per_rank, local = s % per_rank;  // contiguous and explicit tables: rank-major
    if (!explicit_ && kind_ == PlacementKind::RoundRobin) {
      rank = s % ep_size_;
      local = s / ep_size_;
    }
    slot_rank_[static_cast<size_t>(s)] = rank;
    slot_local_[static_cast<size_t>(s)] = local;
    rank_slots_[static_cast<size_t>(rank * per_rank + local)] = s;
    expert_slots_[static_cast<size_t>(slot_expert_[static_cast<size_t>(s)])].push_back(s);
  }
}

int ExpertPlacement::slot(int ep_rank, int local) const {
  EXPAR_ASSERT(ep_rank >= 0 && ep_rank < ep_size_ && local >= 0 && local < local_count(),
               "EP rank {} / local slot {} out of range ({} ranks x {} local slots)", ep_rank, local,
               ep_size_, local_count());
  return rank_slots_[static_cast<size_t>(ep_rank * local_count() + local)];
}

int ExpertPlacement::slot_rank(int s) const {
  EXPAR_ASSERT(s >= 0 && s < num_slots(), "slot {} is out of range [0, {})", s, num_slots());
  return slot_rank_[static_cast<size_t>(s)];
}

int ExpertPlacement::slot_local(int s) const {
  EXPAR_ASSERT(s >= 0 && s < num_slots(), "slot {} is out of range [0, {})", s, num_slots());
  return slot_local_[static_cast<size_t>(s)];
}

int ExpertPlacement::slot_expert(int s) const {
  EXPAR_ASSERT(s >= 0 && s < num_slots(), "slot {} is out of range [0, {})", s, num_slots());
  return slot_expert_[static_cast<size_t>(s)];
}

std::vector<int> ExpertPlacement::local_slots(int ep_rank) const {
  std::vector<int> out;
  for (int l = 0; l < local_count(); ++l) out.push_back(slot(ep_rank, l));
  return out;
}

const std::vector<int>& ExpertPlacement::expert_slots(int e) const {
  EXPAR_ASSERT(e >= 0 && e < num_experts_, "expert {} is out of range [0, {})", e, num_experts_);
  return expert_slots_[static_cast<size_t>(e)];
}

std::vector<int> ExpertPlacement::slot_to_local(int ep_rank) const {
  std::vector<int> map(static_cast<size_t>(num_slots()), -1);
  for (int l = 0; l < local_count(); ++l) map[static_cast<size_t>(slot(ep_rank, l))] = l;
  return map;
}

std::vector<int> ExpertPlacement::local_experts(int ep_rank) const {
  std::vector<int> out;
  for (int l = 0; l < local_count(); ++l) out.push_back(global_expert(ep_rank, l));
  return out;
}

namespace {

int only_slot(const ExpertPlacement& p, int e) {
  const std::vector<int>& slots = p.expert_slots(e);
  EXPAR_ASSERT(slots.size() == 1,
               "expert {} has {} replicas, so it has no single owner: ask expert_slots({}) for its slots", e,
               slots.size(), e);
  return slots.front();
}

}  // namespace

int ExpertPlacement::owner(int e) const {
  return slot_rank(only_slot(*this, e));
}

int ExpertPlacement::local_index(int e) const {
  return slot_local(only_slot(*this, e));
}

std::vector<int> ExpertPlacement::global_to_local(int ep_rank) const {
  EXPAR_ASSERT(!has_replicas(), "global_to_local: the placement has {} redundant slots: use slot_to_local",
               redundant());
  std::vector<int> map(static_cast<size_t>(num_experts_), -1);
  for (int l = 0; l < local_count(); ++l) map[static_cast<size_t>(global_expert(ep_rank, l))] = l;
  return map;
}

}  // namespace expar
