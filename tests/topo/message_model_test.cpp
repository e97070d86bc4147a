// The message model of `expar plan` (topo/message_model.hpp): its laws on hand-computed numbers, and that the
// path with the least modelled time moves with the row size as seed 000 §5.8 argues (small rows: per-row
// messages cost more than packing; large rows: packing costs more than the messages).
#include "expar/topo/message_model.hpp"

#include <gtest/gtest.h>

#include "expar/core/error.hpp"

namespace expar {
namespace {

MessageModelShape shape_of(int64_t row_bytes, int ep) {
  MessageModelShape s;
  s.tokens_per_rank = 100;
  s.top_k = 4;
  s.row_bytes = row_bytes;
  s.ep_mp = ep;
  s.moe_layers = 1;
  s.microbatches = 1;
  return s;
}

const PathMessages& path(const MessageModel& m, const std::string& name) {
  for (const auto& p : m.paths)
    if (p.path == name) return p;
  throw Error("no path " + name);
}

TEST(MessageModel, CountsFollowTheLawsOfEachPath) {
  // 400 routes over an EP group of 16 on 2 nodes of 8: 200 rows per leg cross, 175 go to the 7 node peers.
  const MessageModel m = model_messages(shape_of(1000, 16), {});
  EXPECT_EQ(m.nodes_per_group, 2);
  EXPECT_EQ(m.rows_across_per_leg, 200);
  EXPECT_EQ(m.rows_within_per_leg, 175);
  EXPECT_EQ(path(m, "rowwise").messages_across_per_step, 4 * 200);   // one per row and leg
  EXPECT_EQ(path(m, "block").messages_across_per_step, 4 * 8);       // one per peer on the other node
  EXPECT_EQ(path(m, "aggregated").messages_across_per_step, 4 * 1);  // one per other node
  for (const auto& p : m.paths) EXPECT_EQ(p.bytes_across_per_step, 4 * 200 * 1000) << p.path;
  EXPECT_EQ(path(m, "rowwise").copy_bytes_per_step, 0);
  EXPECT_EQ(path(m, "block").copy_bytes_per_step, 4 * 2 * (200 + 175) * 1000);
  EXPECT_EQ(path(m, "aggregated").copy_bytes_per_step, 4 * 2 * 200 * 1000);
  // rowwise: bytes / link + messages / rate + the node term.
  const double leg = 200e3 / 50e9 + 200 / 100e6 + 175e3 / 450e9;
  EXPECT_NEAR(path(m, "rowwise").seconds_per_step, 4 * leg, 1e-15);
}

TEST(MessageModel, TheFastestPathMovesWithTheRowSize) {
  // Per row across: rowwise pays 1/rate = 10 ns; aggregated 2b/memory; block 2b(X+Y)/X/memory.
  EXPECT_EQ(model_messages(shape_of(4096, 16), {}).fastest, "aggregated");  // 4.1 ns < 7.7 ns < 10 ns
  EXPECT_EQ(model_messages(shape_of(14336, 16), {}).fastest, "rowwise");    // 10 ns < 14.3 ns < 26.9 ns
  MessageModelInputs slow_nic;
  slow_nic.nic_messages_per_s = 1e6;  // a NIC that issues few messages: rowwise loses even with large rows
  EXPECT_EQ(model_messages(shape_of(14336, 16), slow_nic).fastest, "aggregated");
}

TEST(MessageModel, AnEpGroupInsideOneNodeSendsNothingAcross) {
  const MessageModel m = model_messages(shape_of(1000, 8), {});
  EXPECT_EQ(m.nodes_per_group, 1);
  for (const auto& p : m.paths) {
    EXPECT_EQ(p.messages_across_per_step, 0) << p.path;
    EXPECT_EQ(p.bytes_across_per_step, 0) << p.path;
  }
}

TEST(MessageModel, SaysWhyItCannotModelGroupsThatDoNotFillNodesAndRejectsBadParameters) {
  const MessageModel m = model_messages(shape_of(1000, 12), {});
  EXPECT_TRUE(m.paths.empty());
  EXPECT_NE(m.not_modelled.find("EP degree 12 with 8 ranks per node"), std::string::npos) << m.not_modelled;
  EXPECT_NE(format_message_model(m).find("not modelled"), std::string::npos);
  MessageModelInputs bad;
  bad.nic_messages_per_s = 0;
  EXPECT_THROW(model_messages(shape_of(1000, 16), bad), Error);
}

}  // namespace
}  // namespace expar
