#pragma once
// Redundant experts placed by measured load: the policy of DeepSeek's EPLB (issue #36, item 2), arithmetic
// only, so that `expar plan` can show a placement and every rank can compute the same one from the same
// counts without talking to the others.
//
// E logical experts with loads L_e (token rows over a window) get S = E + R physical slots on the M ranks of
// an EP group, S/M per rank (equal slot counts keep every rank's expert buffers the same shape):
//  - replicate: one slot per expert, then each further slot to the expert whose load per replica L_e/c_e is
//    highest (ties: the lower expert id); each replica carries L_e/c_e;
//  - pack: slots heaviest first (ties: lower expert, then lower replica) onto the least-loaded rank that
//    still has room (ties: the lower rank), skipping ranks that already hold a replica of the same expert
//    while another rank with room does not (two replicas on one rank would balance nothing);
//  - node first, when the group spans several nodes of K ranks and the G expert groups (consecutive
//    experts, as DeepSeek-V3's group-limited routing forms them) divide over the nodes: pack whole groups
//    onto nodes (G/nodes each, by group load), then replicate inside each node with S/nodes slots and pack
//    onto that node's ranks, so a token's expert and all its replicas sit in one node. When G does not
//    divide over the nodes, the placement is global over the whole group, as DeepSeek's EPLB falls back.
// Within a rank, slots are ordered by (expert, replica); slot s lives on rank s / (S/M).
// Everything is a function of the inputs alone: the same loads give the same placement on every rank.
#include <optional>
#include <string>
#include <vector>

namespace expar {

struct ExpertBalanceInput {
  std::vector<double> loads;  // per logical expert, finite and >= 0
  int redundant = 0;          // R >= 0: S = E + R
  int ep_size = 1;            // M: S % M == 0
  int ranks_per_node = 0;     // K: 0 = no nodes; else M <= K (one node) or M % K == 0
  int expert_groups = 0;      // G: 0 = one group per expert; else E % G == 0
};

struct PhysicalSlot {
  int expert = 0;   // logical expert
  int replica = 0;  // its index among that expert's replicas, 0-based
  int rank = 0;     // EP rank holding it
  double load = 0;  // L_e / replicas of e
};

struct ExpertBalance {
  int num_experts = 0, num_slots = 0, ep_size = 0, slots_per_rank = 0;
  int nodes = 1;            // nodes the group spans (1 without ranks per node, or when it fits in one)
  bool node_first = false;  // the node-first (hierarchical) policy was used
  int expert_groups = 0;    // G as used (E when not given)
  std::string policy_note;  // why the global policy although the group spans several nodes; else ""

  std::vector<PhysicalSlot> slots;         // index: physical slot id
  std::vector<std::vector<int>> replicas;  // per logical expert: its slot ids, ascending
  std::vector<double> rank_load;           // per rank: the sum of its slots' loads
  double imbalance = 0;                    // load_imbalance(rank_load)

  // The plain contiguous placement without replicas (rank k holds experts [k*E/M, (k+1)*E/M)), when M
  // divides E; otherwise empty, with the reason in contiguous_note.
  std::optional<std::vector<double>> contiguous_rank_load;
  std::optional<double> contiguous_imbalance;
  std::string contiguous_note;

  int replica_count(int expert) const {
    return static_cast<int>(replicas.at(static_cast<size_t>(expert)).size());
  }
  std::vector<int> rank_slots(int rank) const;  // slot ids of `rank`, ascending
};

// (max - mean) / mean of per-rank loads; 0 when every load is 0.
double load_imbalance(const std::vector<double>& rank_load);

// The load per rank of each layer: load_imbalance over the ranks of rows_by_rank[rank][layer] (the rows each
// rank's experts computed in the layer; a rank listing fewer layers computed none in the others). What
// `expar serve`'s metrics and `expar bench generate` report.
struct LayerImbalance {
  std::vector<double> per_layer;  // [layers]: 0 for a layer without rows (a dense one)
  double mean = 0;                // over the layers with rows
  double largest = 0;
};
LayerImbalance layer_imbalance(const std::vector<std::vector<double>>& rows_by_rank);

// Throws expar::Error naming the value, the rule and an accepted fix: no loads, a negative or non-finite
// load, R < 0, M < 1, S % M != 0, K < 0 or a group that neither fits in one node nor fills whole nodes,
// G < 0 or E % G != 0.
ExpertBalance balance_experts(const ExpertBalanceInput& input);

}  // namespace expar
