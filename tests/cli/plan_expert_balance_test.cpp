// `expar plan --expert-load`: the redundant-expert placement of DeepSeek's EPLB policy for a given load, on
// its own or after a model's plan, in the table and under "expert_balance" in --json; every bad input is
// refused with the value, the rule and the fix. Run through the binary, as a user would.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_process.hpp"

namespace expar {
namespace {

using testing::ProcessResult;
using testing::run_process;

ProcessResult plan(const std::vector<std::string>& args) {
  std::vector<std::string> argv{EXPAR_BINARY, "plan"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, 120);
}

nlohmann::json plan_json(std::vector<std::string> args) {
  args.insert(args.end(), {"--json", "-"});
  const ProcessResult r = plan(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

// The refusal's message; fails the test when the command succeeds.
std::string refused(const std::vector<std::string>& args) {
  const ProcessResult r = plan(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error:"), std::string::npos) << r.output;
  return r.output;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One load per expert, Zipf-like (s = 1): round(100000 / (e + 1)).
std::string zipf_loads(int experts) {
  std::string out;
  for (int e = 0; e < experts; ++e) {
    if (e > 0) out += ',';
    out += std::to_string(std::lround(100000.0 / (e + 1)));
  }
  return out;
}

TEST(PlanExpertBalance, ThePlacementAloneAsATable) {
  // Loads {8,1,1,2} on 2 ranks with 2 redundant slots (tests/topo/expert_balance_test.cpp works it by hand):
  // expert 0 gets three replicas; rank 0 holds two of them and expert 2, rank 1 the third, 1 and 3.
  const ProcessResult r = plan({"--expert-load", "8,1,1,2", "--ep", "2", "--redundant-experts", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "EXPERT PLACEMENT (EPLB): 4 experts in 6 slots (2 redundant) on 2 ranks, 3 "
                       "slots per rank"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "     0       6.33333  0(1/3) 0(3/3) 2\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "     1       5.66667  0(2/3) 1 3\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "before 0.500 (contiguous, 2 per rank, no replicas), after 0.056"))
      << r.output;
  // Alone, there is no memory plan.
  EXPECT_FALSE(contains(r.output, "expert weights")) << r.output;
}

TEST(PlanExpertBalance, ThePlacementAloneAsJson) {
  const nlohmann::json j = plan_json({"--expert-load", "8,1,1,2", "--ep", "2", "--redundant-experts", "2"});
  ASSERT_EQ(j.size(), 1u) << j.dump();
  const nlohmann::json& b = j.at("expert_balance");
  EXPECT_EQ(b.at("num_slots"), 6);
  EXPECT_EQ(b.at("slots_per_rank"), 3);
  EXPECT_EQ(b.at("replicas"), nlohmann::json::parse("[[0,1,3],[4],[2],[5]]"));
  std::vector<int> expert, rank;
  for (const auto& s : b.at("slots")) {
    expert.push_back(s.at("expert"));
    rank.push_back(s.at("rank"));
  }
  EXPECT_EQ(expert, (std::vector<int>{0, 0, 2, 0, 1, 3}));
  EXPECT_EQ(rank, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_NEAR(b.at("imbalance").get<double>(), 1.0 / 18, 1e-12);
  EXPECT_DOUBLE_EQ(b.at("contiguous_imbalance").get<double>(), 0.5);
}

TEST(PlanExpertBalance, NodeFirstWithRanksPerNodeAndExpertGroups) {
  // Loads {1,1,6,4}, 4 ranks in 2 nodes of 2, groups {0,1} {2,3}, 4 redundant: the hot group fills node 0
  // (ranks 0 and 1 at 5), the cold one node 1 (ranks 2 and 3 at 1).
  const std::vector<std::string> args{
      "--expert-load",       "1,1,6,4", "--ep", "4", "--ranks-per-node", "2", "--expert-groups", "2",
      "--redundant-experts", "4"};
  const nlohmann::json b = plan_json(args).at("expert_balance");
  EXPECT_EQ(b.at("node_first"), true);
  EXPECT_EQ(b.at("nodes"), 2);
  EXPECT_EQ(b.at("rank_load"), nlohmann::json::parse("[5.0,5.0,1.0,1.0]"));
  const ProcessResult r = plan(args);
  EXPECT_TRUE(contains(r.output, "policy: node first: 2 expert groups packed onto 2 nodes")) << r.output;
  // Without --ranks-per-node the placement is global: expert 2 gets four replicas, the ranks 3.5/3.5/2.5/2.5.
  const nlohmann::json flat =
      plan_json({"--expert-load", "1,1,6,4", "--ep", "4", "--redundant-experts", "4"}).at("expert_balance");
  EXPECT_EQ(flat.at("node_first"), false);
  EXPECT_EQ(flat.at("rank_load"), nlohmann::json::parse("[3.5,3.5,2.5,2.5]"));
}

TEST(PlanExpertBalance, AfterAModelsPlanAndUnderItsJson) {
  // OLMoE has 64 routed experts; a Zipf load at EP 4 with 16 redundant slots (issue #36's shape).
  const std::string loads = zipf_loads(64);
  const std::vector<std::string> args{
      "--preset", "olmoe-1b-7b",         "--ranks", "4", "--ep", "4", "--expert-load",
      loads,      "--redundant-experts", "16"};
  const nlohmann::json j = plan_json(args);
  ASSERT_TRUE(j.contains("stages")) << j.dump();  // the usual plan is still there
  const nlohmann::json& b = j.at("expert_balance");
  EXPECT_EQ(b.at("num_slots"), 80);
  EXPECT_GT(b.at("contiguous_imbalance").get<double>(), 1.8);
  EXPECT_LT(b.at("imbalance").get<double>(), 0.001);
  EXPECT_EQ(b.at("replicas").at(0).size(), 8u);
  const ProcessResult r = plan(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.output.find("MESSAGES"), r.output.find("EXPERT PLACEMENT")) << r.output;

  // Without --expert-load the plan is what it was: no placement in either output.
  const nlohmann::json plain = plan_json({"--preset", "olmoe-1b-7b", "--ranks", "4", "--ep", "4"});
  EXPECT_FALSE(plain.contains("expert_balance"));
  nlohmann::json without = j;
  without.erase("expert_balance");
  EXPECT_EQ(without, plain);
  const ProcessResult table = plan({"--preset", "olmoe-1b-7b", "--ranks", "4", "--ep", "4"});
  EXPECT_FALSE(contains(table.output, "EXPERT PLACEMENT")) << table.output;
}

TEST(PlanExpertBalance, BadInputsAreRefusedWithTheRuleAndTheFix) {
  EXPECT_TRUE(
      contains(refused({"--expert-load", "8,x,1,2"}),
               "the load of expert 1 is 'x', not a finite number: give one number >= 0 per logical expert"));
  EXPECT_TRUE(
      contains(refused({"--expert-load", "8,,1"}), "the load of expert 1 is '', not a finite number"));
  EXPECT_TRUE(
      contains(refused({"--expert-load", "1,inf"}), "the load of expert 1 is 'inf', not a finite number"));
  EXPECT_TRUE(
      contains(refused({"--expert-load=8,-1,1,2"}), "the load of expert 1 is -1: a load counts the tokens"));
  EXPECT_TRUE(contains(refused({"--expert-load", "1,2", "--redundant-experts", "-1"}),
                       "--redundant-experts: -1 is out of range"));
  EXPECT_TRUE(contains(refused({"--redundant-experts", "2"}), "add --expert-load L0,L1,..."));
  EXPECT_TRUE(
      contains(refused({"--preset", "olmoe-1b-7b", "--ranks", "4", "--ep", "4", "--expert-load", "1,2,3"}),
               "--expert-load gives 3 loads, but the model olmoe-1b-7b has 64 routed experts: give one load "
               "per routed expert (64 comma-separated numbers)"));
  EXPECT_TRUE(contains(refused({"--expert-load", "1,2", "--ranks", "4"}),
                       "--ranks belongs to the training plan, but no model is given"));

  // S = 4 + 1 = 5 over 2 ranks: the fix names R values, and the first one runs.
  const std::string slots = refused({"--expert-load", "8,1,1,2", "--ep", "2", "--redundant-experts", "1"});
  EXPECT_TRUE(contains(slots,
                       "S = E + R = 4 + 1 = 5 physical expert slots are not divisible by the EP group size "
                       "M=2"))
      << slots;
  EXPECT_TRUE(contains(slots, "(--redundant-experts) in {0, 2, 4, ...}")) << slots;
  EXPECT_EQ(plan({"--expert-load", "8,1,1,2", "--ep", "2", "--redundant-experts", "0"}).exit_code, 0);

  // 12 ranks over nodes of 8: the fix names ranks per node, and one of them runs.
  const std::string nodes = refused(
      {"--expert-load", "1,1,6,4", "--ep", "12", "--ranks-per-node", "8", "--redundant-experts", "8"});
  EXPECT_TRUE(contains(nodes, "(--ranks-per-node) in {1,2,3,4,6,12} or K >= 12")) << nodes;
  EXPECT_EQ(
      plan({"--expert-load", "1,1,6,4", "--ep", "12", "--ranks-per-node", "6", "--redundant-experts", "8"})
          .exit_code,
      0);
}

}  // namespace
}  // namespace expar
