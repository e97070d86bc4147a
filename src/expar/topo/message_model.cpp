#include "expar/topo/message_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "expar/core/error.hpp"
#include "expar/core/memory.hpp"

namespace expar {

void MessageModelInputs::validate() const {
  EXPAR_CHECK(ranks_per_node >= 1, "--ranks-per-node {} must be at least 1", ranks_per_node);
  auto positive = [](double v, const char* flag) {
    EXPAR_CHECK(std::isfinite(v) && v > 0, "{} {} must be a positive finite number", flag, v);
  };
  positive(link_bytes_per_s, "--link-gbytes-per-s");
  positive(nic_messages_per_s, "--nic-messages-per-s");
  positive(memory_bytes_per_s, "--memory-gbytes-per-s");
  positive(node_bytes_per_s, "--node-gbytes-per-s");
}

MessageModel model_messages(const MessageModelShape& shape, const MessageModelInputs& inputs) {
  inputs.validate();
  const int me = shape.ep_mp, per_node = inputs.ranks_per_node;
  MessageModel m;
  m.inputs = inputs;
  m.shape = shape;
  if (me % per_node != 0 && per_node % me != 0) {
    m.not_modelled = fmt::format(
        "EP degree {} with {} ranks per node: an EP group neither fills whole nodes nor fits in one (pass "
        "--ranks-per-node a divisor or a multiple of --ep to model it)",
        me, per_node);
    return m;
  }
  const int on_node = std::min(me, per_node);
  m.nodes_per_group = me / on_node;
  const int64_t routes = shape.tokens_per_rank * shape.top_k;
  m.rows_across_per_leg = routes * (me - on_node) / me;
  m.rows_within_per_leg = routes * (on_node - 1) / me;
  const int64_t legs = 4LL * shape.moe_layers * shape.microbatches;
  const double b = static_cast<double>(shape.row_bytes);
  const auto x = static_cast<double>(m.rows_across_per_leg), y = static_cast<double>(m.rows_within_per_leg);
  struct Law {
    const char* path;
    double messages, copies;
  };
  const Law laws[] = {
      {"rowwise", x, 0.0},
      {"block", x > 0 ? static_cast<double>(me - on_node) : 0.0, 2.0 * (x + y) * b},
      {"aggregated", x > 0 ? static_cast<double>(m.nodes_per_group - 1) : 0.0, 2.0 * x * b},
  };
  double best = 0.0;
  for (const Law& law : laws) {
    const double leg = x * b / inputs.link_bytes_per_s + law.messages / inputs.nic_messages_per_s +
                       law.copies / inputs.memory_bytes_per_s + y * b / inputs.node_bytes_per_s;
    PathMessages p;
    p.path = law.path;
    p.messages_across_per_step = static_cast<int64_t>(law.messages) * legs;
    p.bytes_across_per_step = m.rows_across_per_leg * shape.row_bytes * legs;
    p.copy_bytes_per_step = static_cast<int64_t>(law.copies) * legs;
    p.seconds_per_step = leg * static_cast<double>(legs);
    if (m.paths.empty() || p.seconds_per_step < best) {
      best = p.seconds_per_step;
      m.fastest = p.path;
    }
    m.paths.push_back(p);
  }
  return m;
}

std::string format_message_model(const MessageModel& m) {
  const auto& in = m.inputs;
  if (!m.not_modelled.empty()) return "\nMESSAGES per rank and step: not modelled: " + m.not_modelled + "\n";
  std::string s = fmt::format(
      "\nMESSAGES per rank and step, EP group of {} over {} node(s) of {} ranks (model: docs/multi_node.md)\n"
      "  rows per leg: {} across nodes, {} within the node; row {}; {} legs x {} MoE layers x {} "
      "microbatch(es)\n"
      "  link {:.0f} GB/s, NIC {:.0f} M messages/s, memory {:.0f} GB/s, node {:.0f} GB/s (per rank)\n",
      m.shape.ep_mp, m.nodes_per_group, in.ranks_per_node, m.rows_across_per_leg, m.rows_within_per_leg,
      format_bytes(m.shape.row_bytes), 4, m.shape.moe_layers, m.shape.microbatches, in.link_bytes_per_s / 1e9,
      in.nic_messages_per_s / 1e6, in.memory_bytes_per_s / 1e9, in.node_bytes_per_s / 1e9);
  s += fmt::format("  {:<12}{:>20}{:>20}{:>20}{:>16}\n", "path", "messages across", "bytes across",
                   "extra copies", "model time");
  for (const auto& p : m.paths)
    s += fmt::format("  {:<12}{:>20}{:>20}{:>20}{:>13.3f} ms{}\n", p.path, p.messages_across_per_step,
                     format_bytes(p.bytes_across_per_step), format_bytes(p.copy_bytes_per_step),
                     p.seconds_per_step * 1e3, p.path == m.fastest ? "  <- least" : "");
  return s;
}

nlohmann::json message_model_json(const MessageModel& m) {
  const auto& in = m.inputs;
  nlohmann::json j = {{"ranks_per_node", in.ranks_per_node},
                      {"link_bytes_per_s", in.link_bytes_per_s},
                      {"nic_messages_per_s", in.nic_messages_per_s},
                      {"memory_bytes_per_s", in.memory_bytes_per_s},
                      {"node_bytes_per_s", in.node_bytes_per_s},
                      {"nodes_per_ep_group", m.nodes_per_group},
                      {"rows_across_per_leg", m.rows_across_per_leg},
                      {"rows_within_per_leg", m.rows_within_per_leg},
                      {"row_bytes", m.shape.row_bytes},
                      {"fastest", m.fastest}};
  if (!m.not_modelled.empty()) j["not_modelled"] = m.not_modelled;
  j["paths"] = nlohmann::json::array();
  for (const auto& p : m.paths)
    j["paths"].push_back({{"path", p.path},
                          {"messages_across_per_step", p.messages_across_per_step},
                          {"bytes_across_per_step", p.bytes_across_per_step},
                          {"copy_bytes_per_step", p.copy_bytes_per_step},
                          {"seconds_per_step", p.seconds_per_step}});
  return j;
}

}  // namespace expar
