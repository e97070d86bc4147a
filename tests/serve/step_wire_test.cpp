// The step messages of `expar serve --transport mpi` (serve/step_wire.hpp): a plan and a rank's result
// decode to exactly what was encoded, every field and the bits of every double included; a message cut
// short or with values after its end is refused.
#include "expar/serve/step_wire.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "expar/core/assert.hpp"

namespace expar::serve {
namespace {

SequenceStep sequence(int64_t slot, std::vector<int32_t> tokens, bool sample, double temperature) {
  SequenceStep s;
  s.slot = slot;
  s.tokens = std::move(tokens);
  s.sample = sample;
  s.sampling.temperature = temperature;
  s.sampling.top_p = 0.95;
  s.sampling.top_k = 40;
  s.seed = std::numeric_limits<uint64_t>::max() - 3;  // above INT64_MAX: travels as its bits
  s.index = 17;
  s.trace_logits = sample;
  return s;
}

StepPlan example_plan() {
  StepPlan p;
  p.prefill = true;
  p.runs_engine = true;
  ReplicaStep a;
  a.add = {{5, 120}, {6, 64}};
  a.remove = {2, 3};
  a.sequences = {sequence(5, {1, 2, 3, 255}, false, 0.0), sequence(6, {9}, true, 0.1 + 0.2)};
  ReplicaStep idle;  // a dummy step: nothing to run
  idle.remove = {4};
  p.replicas = {a, idle};
  return p;
}

TEST(StepWire, PlanRoundTrips) {
  const StepPlan p = example_plan();
  const StepPlan q = decode_plan(encode_plan(p));
  EXPECT_EQ(q.prefill, true);
  EXPECT_EQ(q.runs_engine, true);
  ASSERT_EQ(q.replicas.size(), 2u);
  EXPECT_EQ(q.replicas[0].add, p.replicas[0].add);
  EXPECT_EQ(q.replicas[0].remove, p.replicas[0].remove);
  EXPECT_TRUE(q.replicas[1].sequences.empty());
  EXPECT_EQ(q.replicas[1].remove, std::vector<int64_t>{4});
  ASSERT_EQ(q.replicas[0].sequences.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const SequenceStep& x = p.replicas[0].sequences[i];
    const SequenceStep& y = q.replicas[0].sequences[i];
    EXPECT_EQ(y.slot, x.slot);
    EXPECT_EQ(y.tokens, x.tokens);
    EXPECT_EQ(y.sample, x.sample);
    EXPECT_EQ(std::bit_cast<uint64_t>(y.sampling.temperature),
              std::bit_cast<uint64_t>(x.sampling.temperature));
    EXPECT_EQ(y.sampling.top_p, x.sampling.top_p);
    EXPECT_EQ(y.sampling.top_k, x.sampling.top_k);
    EXPECT_EQ(y.seed, x.seed);
    EXPECT_EQ(y.index, x.index);
    EXPECT_EQ(y.trace_logits, x.trace_logits);
  }
  EXPECT_EQ(encode_plan(q), encode_plan(p));
  // A plan that moves some layers' experts first (serve's rebalancing: only the layers whose table
  // changed), and one that moves none.
  StepPlan moving = p;
  moving.expert_tables = {{1, {3, 0, 1, 3, 2, 0}}, {5, {0, 1, 2, 3, 0, 2}}};
  const StepPlan moved = decode_plan(encode_plan(moving));
  ASSERT_EQ(moved.expert_tables.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(moved.expert_tables[i].layer, moving.expert_tables[i].layer);
    EXPECT_EQ(moved.expert_tables[i].slot_experts, moving.expert_tables[i].slot_experts);
  }
  EXPECT_EQ(encode_plan(moved), encode_plan(moving));
  EXPECT_TRUE(q.expert_tables.empty());
}

TEST(StepWire, ResultRoundTrips) {
  RankResult r;
  r.dp_rank = 3;
  r.samples = true;
  r.tokens.tokens = {7, 0, 255};
  r.tokens.logits_hashes = {std::numeric_limits<uint64_t>::max(), 1};
  r.layer_expert_tokens = {{0, 12, 5, 0}, {}, {3, 0, 0, 9}};
  r.layer_rows = {17, 0, 4};
  r.moved_bytes = 123456789;
  r.move_seconds = 0.125;
  const std::vector<int64_t> wire = encode_result(r);
  const RankResult s = decode_result(wire.data(), wire.size());
  EXPECT_EQ(s.dp_rank, 3);
  EXPECT_TRUE(s.samples);
  EXPECT_EQ(s.tokens.tokens, r.tokens.tokens);
  EXPECT_EQ(s.tokens.logits_hashes, r.tokens.logits_hashes);
  EXPECT_EQ(s.layer_expert_tokens, r.layer_expert_tokens);
  EXPECT_EQ(s.layer_rows, r.layer_rows);
  EXPECT_EQ(s.moved_bytes, r.moved_bytes);
  EXPECT_EQ(s.move_seconds, r.move_seconds);
}

TEST(StepWire, TruncatedOrLongMessagesAreRefused) {
  std::vector<int64_t> wire = encode_plan(example_plan());
  std::vector<int64_t> cut(wire.begin(), wire.end() - 1);
  EXPECT_THROW(decode_plan(cut), InternalError);
  wire.push_back(0);
  EXPECT_THROW(decode_plan(wire), InternalError);
  std::vector<int64_t> huge = {0, 1, int64_t{1} << 40};  // a replica count beyond the message
  EXPECT_THROW(decode_plan(huge), InternalError);
}

}  // namespace
}  // namespace expar::serve
