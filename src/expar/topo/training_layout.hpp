#pragma once
// Training layout: how W ranks are organized into dense data-parallel (DP), context-parallel (CP), tensor-
// parallel (TP) and pipeline (PP) axes, and how the same ranks are folded into the two expert axes of seed
// 000 §5.1: EP_MP (expert-sharding group, size M_E: ranks hold different expert shards and exchange token
// rows) and EP_DP (expert-replica group, size D_E: ranks hold the same shard and reduce its gradients
// together).
//
// Rank ordering (documented contract; other code passes these groups to Comm::subgroup):
//   world = PP * S, S = D * C * TP ranks per pipeline stage
//   rank  = stage * S + s,        s = (dp * C + cp) * TP + tp        (TP fastest, then CP, then DP)
//   s     = ep_dp * M_E + ep_mp                                       (EP_MP fastest)
// Without CP, TP and PP this is equation 8, D = M_E * D_E, with rank = ep_dp * M_E + ep_mp, which gives the
// four-GPU example of Figures 11 and 13: coordinates (EP_DP, EP_MP) are rank 0 (0,0), 1 (0,1), 2 (1,0),
// 3 (1,1); EP_MP groups {0,1},{2,3}; EP_DP groups {0,2},{1,3}.
//
// CP folding (seed 000, Appendix F: D*C = M_E*D_E within each pipeline stage): CP ranks hold different
// sequence chunks but the same dense weights, so for the experts they are simply more token sources. The
// expert axes therefore fold over all D*C (*TP) ranks of a stage, not over the D dense-DP ranks alone; the
// dense gradient is reduced over the D*C ranks that hold the same dense shard (group DenseGrad). TP shards
// only the dense weights; experts are not tensor-sharded in training (expert TP = 1), so TP ranks fold into
// the expert axes like CP ranks do (Megatron-style "MoE parallel folding": TP*C*D = M_E*D_E).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/topo/placement.hpp"
#include "expar/topo/refusal.hpp"

namespace expar {

enum class TrainingGroup : uint8_t {
  Dp,         // dense data-parallel ranks: same stage, cp and tp index (size D)
  Cp,         // context-parallel ranks: same stage, dp and tp index (size C)
  Tp,         // tensor-parallel ranks: same stage, dp and cp index (size TP)
  Pp,         // pipeline ranks: same position inside their stage (size PP)
  DenseGrad,  // dense-gradient reduction: same stage and tp index, all dp and cp (size D*C)
  EpMp,       // expert-sharding group: same stage and ep_dp (size M_E)
  EpDp,       // expert-replica group: same stage and ep_mp (size D_E)
};
std::string training_group_name(TrainingGroup kind);

struct TrainingCoords {
  int stage = 0, dp = 0, cp = 0, tp = 0;  // dense axes
  int ep_mp = 0, ep_dp = 0;               // expert axes (folded over the same ranks)
};

// A layout and the model counts it must divide (0: not checked, for a layout without a model).
struct TrainingLayoutConfig {
  int world = 1, ep_mp = 1, cp = 1, tp = 1, pp = 1;
  int num_experts = 0;  // divisible by M_E
  int layers = 0;       // divisible by PP
  int heads = 0;        // divisible by TP
  std::string model{};  // the model's name, for messages
};

// The rule `config` breaks and the fixes the whole validation accepts (settings "M_E", "C", "TP", "PP";
// never W, the ranks one has), or nullopt when TrainingLayout accepts it. Rules, in order: every degree
// >= 1; PP divides layers; TP divides heads; C*TP*PP divides W; M_E divides the D*C*TP ranks of a stage;
// M_E divides num_experts.
std::optional<LayoutRefusal> training_layout_refusal(const TrainingLayoutConfig& config);

struct TrainingLayout {
  // Throws expar::Error with training_layout_refusal's message.
  explicit TrainingLayout(const TrainingLayoutConfig& config);
  TrainingLayout(int world, int ep_mp, int cp = 1, int tp = 1, int pp = 1);

  int world;       // W
  int cp;          // C
  int tp;          // dense tensor-parallel degree
  int pp;          // pipeline stages
  int dp;          // D = W / (C * TP * PP)
  int ep_mp;       // M_E
  int ep_dp;       // D_E = D * C * TP / M_E
  int stage_size;  // S = D * C * TP = M_E * D_E

  int rank_of(int stage, int dp_index, int cp_index, int tp_index) const;
  int rank_of_expert_coords(int stage, int ep_dp_index, int ep_mp_index) const;
  TrainingCoords coords(int rank) const;

  // Every group of one kind, each sorted ascending, groups ordered by their smallest rank: a partition of
  // [0, world).
  std::vector<std::vector<int>> groups(TrainingGroup kind) const;
  std::vector<int> group_of(int rank, TrainingGroup kind) const;
  int group_size(TrainingGroup kind) const;

  // Experts are sharded over EP_MP: rank r holds placement.local_experts(coords(r).ep_mp). Throws
  // unless M_E divides num_experts, suggesting the M_E this layout accepts with that many experts.
  ExpertPlacement expert_placement(int num_experts, PlacementKind kind = PlacementKind::Contiguous) const;
  std::vector<int> local_experts(int rank, int num_experts,
                                 PlacementKind kind = PlacementKind::Contiguous) const;

 private:
  void check_rank(int rank) const;
};

}  // namespace expar
