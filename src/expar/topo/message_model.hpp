#pragma once
// The message model behind `expar plan`'s MESSAGES section: what each execution path sends across nodes per
// training step, and a first-order time for it, so that one can see where each path wins (seed 000 §5.8: the
// NIC message-rate problem of rowwise EP across nodes). Per rank, balanced routing, no drops:
//   rows across nodes  X = T·K·(M_E − R_E)/M_E  per leg, where R_E = min(M_E, ranks per node) is the part of
//                      the EP group on the rank's own node; rows within the node  Y = T·K·(R_E − 1)/M_E.
//   row bytes          b = d_model · activation bytes.
//   messages across    rowwise: X (one one-sided put or get per route row); block: M_E − R_E (one per peer
//                      on another node); aggregated: M_E/R_E − 1 (one per other node of the group, per rank).
//   extra copies       rowwise: none (rows land in place); block: pack + unpack of every row sent,
//                      2·(X + Y)·b; aggregated: pack at the source + forward inside the destination node of
//                      every row across, 2·X·b.
//   time of a leg      X·b / link bandwidth + messages / NIC message rate + copies / memory bandwidth
//                      + Y·b / node bandwidth   (the last term is the same for every path).
//   per step           × 4 legs (dispatch, combine, and their adjoints in backward) × MoE layers ×
//   microbatches.
// Bandwidths and rates are per rank (one NIC per rank, as on 8-GPU nodes with 8 NICs). It ignores latency,
// overlap, congestion and routing imbalance: it ranks paths, it does not predict step times.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace expar {

struct MessageModelInputs {
  int ranks_per_node = 8;
  double link_bytes_per_s = 50e9;      // network bandwidth per rank (400 Gb/s)
  double nic_messages_per_s = 100e6;   // messages a rank's NIC issues per second
  double memory_bytes_per_s = 2000e9;  // local copy bandwidth (pack, unpack, forward)
  double node_bytes_per_s = 450e9;     // rank-to-rank bandwidth inside a node
  // Validates every field (expar::Error naming the flag and the rule).
  void validate() const;
};

// What the model needs of a plan: per rank.
struct MessageModelShape {
  int64_t tokens_per_rank = 0;  // T per microbatch
  int top_k = 0;
  int64_t row_bytes = 0;  // d_model · activation bytes
  int ep_mp = 1;          // M_E
  int moe_layers = 0;     // of the rank's pipeline stage
  int microbatches = 1;
};

struct PathMessages {
  std::string path;
  int64_t messages_across_per_step = 0;  // per rank
  int64_t bytes_across_per_step = 0;
  int64_t copy_bytes_per_step = 0;
  double seconds_per_step = 0.0;  // the modelled time of the EP traffic of one step
};

struct MessageModel {
  MessageModelInputs inputs;
  MessageModelShape shape;
  int nodes_per_group = 1;  // nodes an EP group spans
  int64_t rows_across_per_leg = 0, rows_within_per_leg = 0;
  std::vector<PathMessages> paths;  // rowwise, block, aggregated
  std::string fastest;              // the path with the least modelled time
  // Empty when the model applies; else why not (an EP group that neither fills whole nodes nor fits in
  // one), and `paths` is empty.
  std::string not_modelled;
};

// Throws expar::Error for bad inputs (MessageModelInputs::validate).
MessageModel model_messages(const MessageModelShape& shape, const MessageModelInputs& inputs);

std::string format_message_model(const MessageModel& m);
nlohmann::json message_model_json(const MessageModel& m);

}  // namespace expar
