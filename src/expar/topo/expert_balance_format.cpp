#include "expar/topo/expert_balance_format.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace expar {

namespace {

// "5" for an expert with one slot, "5(2/3)" for the second of its three replicas.
std::string slot_label(const ExpertBalance& b, const PhysicalSlot& slot) {
  const int count = b.replica_count(slot.expert);
  return count == 1 ? fmt::format("{}", slot.expert)
                    : fmt::format("{}({}/{})", slot.expert, slot.replica + 1, count);
}

std::string policy_text(const ExpertBalance& b) {
  if (b.node_first)
    return fmt::format("node first: {} expert groups packed onto {} nodes, replicated inside each",
                       b.expert_groups, b.nodes);
  if (!b.policy_note.empty()) return b.policy_note;
  return "global";
}

}  // namespace

std::string format_expert_balance(const ExpertBalance& b) {
  std::string out = fmt::format(
      "\nEXPERT PLACEMENT (EPLB): {} experts in {} slots ({} redundant) on {} ranks, {} slots per rank\n"
      "  policy: {}\n",
      b.num_experts, b.num_slots, b.num_slots - b.num_experts, b.ep_size, b.slots_per_rank, policy_text(b));
  out += "  rank          load  experts (logical ids; e(r/c): replica r of expert e's c)\n";
  for (int rank = 0; rank < b.ep_size; ++rank) {
    std::vector<std::string> labels;
    for (int slot : b.rank_slots(rank)) labels.push_back(slot_label(b, b.slots[static_cast<size_t>(slot)]));
    out += fmt::format("  {:>4}  {:>12.6g}  {}\n", rank, b.rank_load[static_cast<size_t>(rank)],
                       fmt::join(labels, " "));
  }
  if (b.contiguous_imbalance) {
    out += fmt::format(
        "  imbalance (max - mean)/mean: before {:.3f} (contiguous, {} per rank, no replicas), after "
        "{:.3f}\n",
        *b.contiguous_imbalance, b.num_experts / b.ep_size, b.imbalance);
  } else {
    out += fmt::format("  imbalance (max - mean)/mean: after {:.3f} ({})\n", b.imbalance, b.contiguous_note);
  }
  return out;
}

nlohmann::json expert_balance_json(const ExpertBalance& b) {
  nlohmann::json slots = nlohmann::json::array();
  for (const PhysicalSlot& s : b.slots)
    slots.push_back({{"expert", s.expert}, {"replica", s.replica}, {"rank", s.rank}, {"load", s.load}});
  nlohmann::json j = {
      {"num_experts", b.num_experts},
      {"redundant_experts", b.num_slots - b.num_experts},
      {"num_slots", b.num_slots},
      {"ep_size", b.ep_size},
      {"slots_per_rank", b.slots_per_rank},
      {"nodes", b.nodes},
      {"node_first", b.node_first},
      {"expert_groups", b.expert_groups},
      {"policy_note", b.policy_note},
      {"slots", slots},
      {"replicas", b.replicas},
      {"rank_load", b.rank_load},
      {"imbalance", b.imbalance},
      {"contiguous_rank_load", nullptr},
      {"contiguous_imbalance", nullptr},
      {"contiguous_note", b.contiguous_note},
  };
  if (b.contiguous_rank_load) j["contiguous_rank_load"] = *b.contiguous_rank_load;
  if (b.contiguous_imbalance) j["contiguous_imbalance"] = *b.contiguous_imbalance;
  return j;
}

}  // namespace expar
