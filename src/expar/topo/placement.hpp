#pragma once
// Expert placement: which rank of an EP group holds which routed expert, as a table of physical SLOTS.
//
// E logical experts (what the router picks) live in S >= E physical slots, S/M on each of the M ranks
// (issue #36 item 1): every slot holds one logical expert, every logical expert has at least one slot, and an
// expert with several slots has REPLICAS (identical weights). Slot ids are what the route map, the paths and
// the expert-side buffers work on (an expert-side "local expert" is a slot); expert ids are what the router
// and the checkpoints name.
//  - Contiguous (R = 0): slot e holds expert e, on rank e / E_L as local slot e % E_L (seed 002's placement).
//  - RoundRobin (R = 0): slot e holds expert e, on rank e mod M as local slot e / M.
//  - An explicit slot table (from_slots, from_balance; R = S - E >= 0): slot s holds expert slot_experts[s],
//    on rank s / (S/M) as local slot s % (S/M), the layout of topo/expert_balance.hpp. E need not divide M;
//    S must.
// Without replicas slot id = expert id in the contiguous and round-robin forms (an explicit table may hold
// the experts in another order: a repacked placement with R = 0); owner / local_index / global_to_local keep
// their seed-002 meaning without replicas; with replicas they refuse an expert that has several slots (ask
// expert_slots).
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

struct ExpertBalance;

// One MoE layer's slot table (ExpertPlacement::from_slots): every MoE layer has its own placement, since
// each layer's hot experts differ, and a rebalance carries only the layers whose table changes.
struct LayerSlotTable {
  int layer = 0;                  // the model's layer index (an MoE layer)
  std::vector<int> slot_experts;  // [S]: the logical expert each slot holds
  bool operator==(const LayerSlotTable&) const = default;
};

enum class PlacementKind : uint8_t { Contiguous, RoundRobin };
PlacementKind placement_from_name(const std::string& name);  // "contiguous" | "round-robin"
std::string placement_name(PlacementKind kind);
// Every placement's name, in enum order (the choices the command line lists).
std::vector<std::string> placement_names();

class ExpertPlacement {
 public:
  // Throws expar::Error unless num_experts % ep_size == 0 (the message lists the valid ep sizes).
  ExpertPlacement(int num_experts, int ep_size, PlacementKind kind = PlacementKind::Contiguous);
  // The explicit slot table: slot s holds logical expert slot_experts[s] and lives on rank s / (S/M). Throws
  // expar::Error naming the fix unless S % M == 0, every entry is in [0, num_experts) and every expert has a
  // slot. kind() is Contiguous (the slot layout is rank-major, like the contiguous one).
  static ExpertPlacement from_slots(int num_experts, int ep_size, std::vector<int> slot_experts);
  // The placement topo/expert_balance.hpp chose (its slots are already rank-major).
  static ExpertPlacement from_balance(const ExpertBalance& balance);

  int num_experts() const { return num_experts_; }                         // E: logical experts
  int num_slots() const { return static_cast<int>(slot_expert_.size()); }  // S = E + R
  int redundant() const { return num_slots() - num_experts_; }             // R
  bool has_replicas() const { return num_slots() > num_experts_; }
  int ep_size() const { return ep_size_; }
  int local_count() const { return num_slots() / ep_size_; }  // slots per rank (E_L without replicas)
  PlacementKind kind() const { return kind_; }
  bool explicit_slots() const { return explicit_; }  // made by from_slots / from_balance

  // Slots (physical): the ids the route map and the paths index.
  int slot(int ep_rank, int local) const;                  // the slot id of `ep_rank`'s local slot `local`
  int slot_rank(int slot) const;                           // the EP rank holding it
  int slot_local(int slot) const;                          // its index among that rank's slots
  int slot_expert(int slot) const;                         // the logical expert it holds
  std::vector<int> local_slots(int ep_rank) const;         // slot ids, in local order
  const std::vector<int>& expert_slots(int expert) const;  // its replicas' slot ids, ascending
  int replica_count(int expert) const { return static_cast<int>(expert_slots(expert).size()); }
  // Rank `ep_rank`'s index of each slot: size S, the local index of each slot on it, -1 where not local.
  std::vector<int> slot_to_local(int ep_rank) const;

  // Logical experts by position: defined for every placement.
  int global_expert(int ep_rank, int local) const { return slot_expert(slot(ep_rank, local)); }
  // The logical experts of `ep_rank`'s slots, in local order (an expert appears once per replica on the
  // rank): what a weight loader loads for the rank.
  std::vector<int> local_experts(int ep_rank) const;

  // Logical expert -> position: only for an expert with one slot (throws naming expert_slots otherwise).
  int owner(int expert) const;        // EP rank that holds expert e
  int local_index(int expert) const;  // its index among the owner's local slots
  // Size num_experts: the local index of each expert on `ep_rank`, -1 where not local. Throws when the
  // placement has replicas (use slot_to_local).
  std::vector<int> global_to_local(int ep_rank) const;

 private:
  ExpertPlacement() = default;
  void index_slots();  // fills expert_slots_ and slot_rank_ / slot_local_ / rank_slots_ from slot_expert_

  int num_experts_ = 0, ep_size_ = 1;
  PlacementKind kind_ = PlacementKind::Contiguous;
  bool explicit_ = false;
  std::vector<int> slot_expert_;                // [S]
  std::vector<int> slot_rank_, slot_local_;     // [S]
  std::vector<int> rank_slots_;                 // [M x S/M]: rank-major
  std::vector<std::vector<int>> expert_slots_;  // [E]
};

}  // namespace expar
