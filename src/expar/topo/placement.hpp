#pragma once
// Expert placement: which rank of an EP group owns which routed expert.
//  - Contiguous: rank k owns experts [k*E_L, (k+1)*E_L) (seed 002's only supported placement).
//  - RoundRobin: expert e lives on rank e mod M, as local expert e / M.
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

enum class PlacementKind : uint8_t { Contiguous, RoundRobin };
PlacementKind placement_from_name(const std::string& name);  // "contiguous" | "round-robin"
std::string placement_name(PlacementKind kind);
// Every placement's name, in enum order (the choices the command line lists).
std::vector<std::string> placement_names();

class ExpertPlacement {
 public:
  // Throws expar::Error unless num_experts % ep_size == 0 (the message lists the valid ep sizes).
  ExpertPlacement(int num_experts, int ep_size, PlacementKind kind = PlacementKind::Contiguous);

  int num_experts() const { return num_experts_; }
  int ep_size() const { return ep_size_; }
  int local_count() const { return num_experts_ / ep_size_; }  // E_L
  PlacementKind kind() const { return kind_; }

  int owner(int expert) const;        // EP rank that owns global expert e
  int local_index(int expert) const;  // its index among the owner's local experts
  int global_expert(int ep_rank, int local) const;
  std::vector<int> local_experts(int ep_rank) const;  // global ids, in local order
  // Size num_experts: the local index of each expert on `ep_rank`, -1 where not local.
  std::vector<int> global_to_local(int ep_rank) const;

 private:
  int num_experts_, ep_size_;
  PlacementKind kind_;
};

}  // namespace expar
