// serve's rebalancer places every MoE layer by its own loads (issue #36): a due rebalance returns the tables
// of the layers whose EPLB placement changed, and only those; a layer whose loads keep its table, and one
// without rows in the window (a dense layer), are left out; each layer's table is DeepSeek's policy on that
// layer's loads summed over the window alone (not the other layers').
#include "expar/serve/expert_rebalancer.hpp"

#include <gtest/gtest.h>

#include "expar/topo/expert_balance.hpp"

namespace expar::serve {
namespace {

constexpr int kExperts = 8, kRedundant = 2, kRanks = 2;

std::vector<int> eplb_table(const std::vector<double>& loads) {
  ExpertBalanceInput in;
  in.loads = loads;
  in.redundant = kRedundant;
  in.ep_size = kRanks;
  std::vector<int> table;
  for (const PhysicalSlot& s : balance_experts(in).slots) table.push_back(s.expert);
  return table;
}

std::vector<double> as_loads(const std::vector<int64_t>& tokens) {
  return {tokens.begin(), tokens.end()};
}

// What a window of the two steps holds for `layer`: their rows per expert, summed.
std::vector<double> window_loads(const StepLoad& a, const StepLoad& b, int layer) {
  std::vector<double> loads(kExperts);
  for (int e = 0; e < kExperts; ++e)
    loads[static_cast<size_t>(e)] =
        static_cast<double>(a.layer_expert_tokens[static_cast<size_t>(layer)][static_cast<size_t>(e)] +
                            b.layer_expert_tokens[static_cast<size_t>(layer)][static_cast<size_t>(e)]);
  return loads;
}

TEST(ExpertRebalancer, MovesOnlyTheLayersWhoseTableChanges) {
  // The layout's initial placement: EPLB on a uniform load (experts 0 and 1 replicated).
  const std::vector<int> uniform = eplb_table(std::vector<double>(kExperts, 1.0));
  const ExpertPlacement initial = ExpertPlacement::from_slots(kExperts, kRanks, uniform);
  ExpertRebalancer rebalancer({.window = 2, .interval = 2}, initial, 3);
  // Layer 0 is dense (no rows); layer 1 routes uniformly (its table stays); layer 2 is skewed towards
  // experts 5 and 6, and the skew grows in the second step (the window sums both).
  const std::vector<int64_t> flat(kExperts, 10);
  StepLoad first, second;
  first.layer_expert_tokens = {std::vector<int64_t>(kExperts, 0), flat, {1, 2, 3, 4, 5, 90, 60, 1}};
  second.layer_expert_tokens = {std::vector<int64_t>(kExperts, 0), flat, {3, 1, 2, 1, 4, 70, 80, 2}};
  EXPECT_TRUE(rebalancer.before_step().empty()) << "nothing is due before the first interval";
  rebalancer.after_step(first);
  EXPECT_TRUE(rebalancer.before_step().empty()) << "one step of an interval of 2";
  rebalancer.after_step(second);
  const std::vector<int> want = eplb_table(window_loads(first, second, 2));
  ASSERT_NE(want, uniform) << "the skewed loads must give another placement, or the test shows nothing";
  ASSERT_EQ(eplb_table(as_loads(flat)), uniform);
  const std::vector<LayerSlotTable> moved = rebalancer.before_step();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].layer, 2);
  EXPECT_EQ(moved[0].slot_experts, want);
  EXPECT_EQ(rebalancer.slot_experts(2), want);
  EXPECT_EQ(rebalancer.slot_experts(1), uniform);
  EXPECT_EQ(rebalancer.slot_experts(0), uniform);
  EXPECT_EQ(rebalancer.rebalances(), 1);
  // The same loads again: every table stays, nothing moves, and no rebalance is counted.
  rebalancer.after_step(first);
  rebalancer.after_step(second);
  EXPECT_TRUE(rebalancer.before_step().empty());
  EXPECT_EQ(rebalancer.rebalances(), 1);
  // Now layer 1 turns skewed the other way while layer 2 keeps its loads: only layer 1 moves.
  StepLoad third = second, fourth = second;
  third.layer_expert_tokens[1] = {80, 1, 1, 1, 1, 1, 1, 50};
  fourth.layer_expert_tokens = first.layer_expert_tokens;
  fourth.layer_expert_tokens[1] = {70, 2, 1, 1, 1, 1, 1, 60};
  rebalancer.after_step(fourth);  // the window holds `fourth` and `third`: layer 2's sum is unchanged
  rebalancer.after_step(third);
  const std::vector<LayerSlotTable> again = rebalancer.before_step();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].layer, 1);
  EXPECT_EQ(again[0].slot_experts, eplb_table(window_loads(third, fourth, 1)));
  EXPECT_EQ(rebalancer.slot_experts(2), want);
  EXPECT_EQ(rebalancer.rebalances(), 2);
}

}  // namespace
}  // namespace expar::serve
