#pragma once
// Inference layout (seed 002): W = TP * DP ranks. Attention always uses TP inside one DP replica; MoE layers
// reinterpret the ranks as ep_degree expert partitions, each a group of ep_tp ranks that shard the expert
// intermediate dimension. The partitions of one EP group hold one copy of the experts between them; with DP
// replicas there may be several groups, each holding its own copy (W / (ep_degree * ep_tp) copies).
//
// Rank ordering: rank = dp_index * TP + tp_index (a DP replica is a contiguous block of TP ranks).
//   TP groups      [0..TP-1], [TP..2TP-1], ...                  (attention; outer MoE collectives)
//   DP groups      {t, t+TP, t+2TP, ...}                         (every replica at one TP position)
//   EP_DP groups   the DP group's ranks inside one EP group      (cross-DP token exchange)
//   EP_TP groups   contiguous blocks of ep_tp ranks              (intermediate-dimension shards)
//   EP groups      in each copy's block of ep_degree * ep_tp ranks, the ranks at the same position in every
//                  partition (ep_rank = rank % copy / ep_tp)
// Modes:
//   no EP          ep_degree = 1: EP_TP groups are the TP groups, EP groups are single ranks; every rank
//                  holds all experts with intermediate / TP features.
//   full EP        ep_degree = TP * DP (the default when EP is enabled): EP_TP groups are single ranks.
//   variable EP    ep_degree < TP, dividing it: e.g. TP=8, ep_degree=2 gives EP_TP {0..3},{4..7} and EP
//                  {0,4},{1,5},{2,6},{3,7}. With DP > 1 each replica is its own copy (no cross-DP exchange).
//   cross-DP EP    DP > 1, ep_degree = g * TP with g > 1 dividing DP: EP groups of g consecutive DP replicas,
//                  whole experts (ep_tp 1), tokens exchanged among those g replicas only (EP_DP groups of g).
//                  g = DP is seed 002's cross-DP EP over every rank; g < DP lifts its limitation 2. g = 1
//                  (ep_degree = TP) is full EP inside each replica.
// Validation follows seed 002 where it does not lift a limitation: ep_degree > 1 needs
// enable_expert_parallel; world % ep_degree == 0; ep_degree divides TP or is a multiple of it (an EP group is
// inside one replica or joins whole replicas); num_experts % ep_degree == 0; ep_tp divides the experts'
// intermediate size. With redundant experts (issue #36) the slots, not the experts, must divide over
// ep_degree, and redundant_experts > 0 needs enable_expert_parallel. Unlike seed 002 (limitation 4)
// round-robin placement is supported. A refusal (inference_refusal) suggests ep_degree, data_parallel_size or
// enable_expert_parallel values that the whole validation accepts; another TP only when nothing else is,
// since TP must also divide the model's attention heads (a rule of the weights, not of this layout).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "expar/topo/placement.hpp"
#include "expar/topo/refusal.hpp"

namespace expar {

// How an inference run lays its ranks out: the command line's --tp, --dp, --enable-expert-parallel, --ep and
// --placement. The one description of a run's parallelism: the engine's options (infer::GenerateOptions)
// and the layout's input (InferenceConfig) are this struct with what each adds.
struct InferenceParallelism {
  int tp = 1;
  int dp = 1;
  bool enable_expert_parallel = false;
  std::optional<int> ep_degree;  // unset: TP * DP with EP, 1 without
  PlacementKind placement = PlacementKind::Contiguous;
  // Redundant experts (issue #36): slot s of the ep_degree partitions' slots holds logical expert
  // expert_slots[s] (ExpertPlacement::from_slots: slots per partition equal, every expert in one or more);
  // empty: one slot per expert, laid out by `placement`, or redundant_experts > 0's table.
  std::vector<int> expert_slots;
  // --redundant-experts R (expert_slots empty): S = E + R slots over the ep_degree partitions, placed by
  // DeepSeek's EPLB policy (topo/expert_balance.hpp) for a uniform load, so every run starts from the same
  // table; `expar serve` then moves them by measured load (docs/serving.md). Needs expert parallelism.
  int redundant_experts = 0;
};

// The layout's input: the run's parallelism and the model's sizes its rules check.
struct InferenceConfig : InferenceParallelism {
  InferenceConfig() = default;
  InferenceConfig(const InferenceParallelism& parallelism, int experts, int intermediate_size = 0)
      : InferenceParallelism(parallelism), num_experts(experts), intermediate(intermediate_size) {}
  int num_experts = 1;
  // The experts' intermediate size, which the ep_tp ranks of an EP_TP group split (0: not checked here;
  // intermediate_shard checks it when the weights are sharded, with the same message). infer leaves it 0:
  // the sampling path of expar generate uses the layout but not its intermediate split.
  int intermediate = 0;
};

// The rule `config` breaks and the fixes the whole validation accepts (settings "ep_degree",
// "data_parallel_size", "enable_expert_parallel" (0/1), "tensor_parallel_size"), or nullopt when
// InferenceLayout accepts it.
std::optional<LayoutRefusal> inference_refusal(const InferenceConfig& config);

enum class InferenceGroup : uint8_t { Tp, Dp, EpDp, EpTp, Ep };

struct InferenceRankInfo {
  int rank = 0;
  int tp_rank = 0, dp_rank = 0;
  int expert_copy = 0;                 // which copy of the experts (EP group block) this rank is part of
  int ep_rank = 0;                     // index of this rank's expert partition in its copy
  int ep_tp_rank = 0, ep_tp_size = 1;  // which of ep_tp_size intermediate-dimension shards this rank holds
  std::vector<int> local_experts;      // global expert ids, in local order
};

class InferenceLayout {
 public:
  // Applies every validation rule of seed 002; throws expar::Error with inference_refusal's message.
  explicit InferenceLayout(const InferenceConfig& config);

  int world() const { return tp_ * dp_; }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  bool expert_parallel() const { return ep_enabled_; }
  // DP replicas whose tokens one EP group exchanges (ep_degree / TP when that is above 1, else 1).
  int ep_dp_size() const;
  bool cross_dp_ep() const { return ep_dp_size() > 1; }
  bool variable_ep() const { return ep_enabled_ && ep_degree_ < tp_; }
  int ep_degree() const { return ep_degree_; }
  int ep_tp_size() const;  // ranks sharing one expert partition (intermediate shards)
  // Ranks holding one copy of the experts between them (ep_degree * ep_tp_size: TP * ep_dp_size), and how
  // many copies the world holds.
  int copy_ranks() const { return tp_ * ep_dp_size(); }
  int expert_copies() const { return world() / copy_ranks(); }
  const ExpertPlacement& placement() const { return placement_; }
  // The same layout with its experts in the slot table `slot_experts` (ExpertPlacement::from_slots over the
  // same ep_degree): what a rebalance moves the weights to. Throws expar::Error naming the rule when the
  // table does not fit the layout.
  InferenceLayout with_expert_slots(std::vector<int> slot_experts) const;

  std::vector<std::vector<int>> groups(InferenceGroup kind) const;  // partition of [0, world), sorted
  std::vector<int> group_of(int rank, InferenceGroup kind) const;
  InferenceRankInfo rank_info(int rank) const;
  // The [begin, end) slice of an expert's intermediate dimension held by `rank`; throws unless
  // ep_tp_size divides `intermediate` (inference_refusal's message for this layout with it).
  std::pair<int, int> intermediate_shard(int rank, int intermediate) const;

 private:
  void check_rank(int rank) const;
  int tp_, dp_;
  bool ep_enabled_;
  int ep_degree_;
  ExpertPlacement placement_;
  InferenceConfig config_;  // as given (ep_degree may be unset), for intermediate_shard's refusal
};

}  // namespace expar
