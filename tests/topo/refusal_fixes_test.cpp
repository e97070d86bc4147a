// Every suggestion a layout refusal makes is accepted: over many inference layouts (TP, DP, EP flag, EP
// degree, experts), training layouts (W, C, TP, PP, M_E, experts, layers, heads) and plans, each refused
// one's fixes are applied value by value, and the layout (or the plan) must then be accepted. A fix lists
// the whole accepted set: a value of that setting it leaves out is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/topo/inference_layout.hpp"
#include "expar/topo/model_shapes.hpp"
#include "expar/topo/plan.hpp"
#include "expar/topo/training_layout.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Applies one setting the way a user would change the option; written here, not taken from the validator,
// so a validator that suggests for the wrong field fails.
InferenceConfig set(InferenceConfig c, const std::string& name, int value) {
  if (name == "ep_degree") {
    c.ep_degree = value;
  } else if (name == "data_parallel_size") {
    c.dp = value;
  } else if (name == "enable_expert_parallel") {
    c.enable_expert_parallel = value != 0;
  } else if (name == "tensor_parallel_size") {
    c.tp = value;
  } else if (name == "redundant_experts") {
    c.redundant_experts = value;
  } else if (name == "placement") {
    c.placement = value == 0 ? PlacementKind::Contiguous : PlacementKind::RoundRobin;
  } else {
    ADD_FAILURE() << "an inference fix names '" << name << "'";
  }
  return c;
}

TrainingLayoutConfig set(TrainingLayoutConfig c, const std::string& name, int value) {
  if (name == "M_E") {
    c.ep_mp = value;
  } else if (name == "C") {
    c.cp = value;
  } else if (name == "TP") {
    c.tp = value;
  } else if (name == "PP") {
    c.pp = value;
  } else {
    ADD_FAILURE() << "a training fix names '" << name << "'";
  }
  return c;
}

PlanConfig set(PlanConfig c, const std::string& name, int value) {
  TrainingLayoutConfig l{c.world, c.ep_mp, c.cp, c.tp, c.pp};
  l = set(l, name, value);
  c.ep_mp = l.ep_mp;
  c.cp = l.cp;
  c.tp = l.tp;
  c.pp = l.pp;
  return c;
}

template <class Config>
Config apply(Config c, const LayoutFix& fix, int value) {
  for (const auto& [name, v] : fix.with) c = set(c, name, v);
  return set(c, fix.setting, value);
}

std::string describe(const InferenceConfig& c) {
  return fmt::format("tp={} dp={} ep_flag={} ep={} experts={} intermediate={} redundant={} placement={}",
                     c.tp, c.dp, c.enable_expert_parallel,
                     c.ep_degree ? std::to_string(*c.ep_degree) : "unset", c.num_experts, c.intermediate,
                     c.redundant_experts, placement_name(c.placement));
}

std::string describe(const TrainingLayoutConfig& c) {
  return fmt::format("W={} M_E={} C={} TP={} PP={} experts={} layers={} heads={}", c.world, c.ep_mp, c.cp,
                     c.tp, c.pp, c.num_experts, c.layers, c.heads);
}

bool accepted(const InferenceConfig& c) {
  try {
    (void)InferenceLayout(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool accepted(const TrainingLayoutConfig& c) {
  try {
    (void)TrainingLayout(c);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The refusal's message is the error's, each fix is in it, every suggested value is accepted, and (for a
// fix of one setting alone) every other value up to `limit` is refused.
template <class Config>
void check_refusal(const Config& c, const LayoutRefusal& r, int limit, int* suggestions) {
  SCOPED_TRACE(describe(c) + "\n" + r.message());
  try {
    if constexpr (std::is_same_v<Config, InferenceConfig>)
      (void)InferenceLayout(c);
    else
      (void)TrainingLayout(c);
    ADD_FAILURE() << "refused by the refusal but accepted by the layout";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), r.message());
  }
  ASSERT_FALSE(r.fixes.empty()) << "a refusal without a way out";
  for (const LayoutFix& fix : r.fixes) {
    EXPECT_THAT(r.message(), HasSubstr(fix.text()));
    ASSERT_FALSE(fix.values.empty());
    for (int v : fix.values) {
      EXPECT_TRUE(accepted(apply(c, fix, v))) << fix.setting << "=" << v << " was suggested";
      ++*suggestions;
    }
    if (!fix.with.empty()) continue;
    // A flag or the placement: 0 or 1. Redundant experts: the fix lists every accepted R up to
    // num_experts + ep_degree - 1 (any R making the slots a multiple of ep_degree is accepted).
    int last = fix.setting == "enable_expert_parallel" || fix.setting == "placement" ? 1 : limit;
    if constexpr (std::is_same_v<Config, InferenceConfig>)
      if (fix.setting == "redundant_experts")
        last =
            c.num_experts + std::max(1, c.ep_degree.value_or(c.enable_expert_parallel ? c.tp * c.dp : 1)) - 1;
    for (int v = 0; v <= last; ++v) {
      if (std::find(fix.values.begin(), fix.values.end(), v) != fix.values.end()) continue;
      // A fix with a period promises every larger multiple of it as well, and nothing else.
      const bool promised = fix.period > 0 && v > fix.values.back() && v % fix.period == 0;
      EXPECT_EQ(accepted(apply(c, fix, v)), promised)
          << fix.setting << "=" << v
          << (promised ? " is promised by the period but refused" : " is accepted but not suggested");
    }
  }
}

// One layout: accepted by the layout where the refusal finds nothing to say, else check_refusal. Returns
// whether it was refused.
template <class Config>
bool check_layout(const Config& c, int limit, int* suggestions) {
  std::optional<LayoutRefusal> r;
  if constexpr (std::is_same_v<Config, InferenceConfig>)
    r = inference_refusal(c);
  else
    r = training_layout_refusal(c);
  if (!r) {
    EXPECT_TRUE(accepted(c)) << describe(c);
    return false;
  }
  check_refusal(c, *r, limit, suggestions);
  return true;
}

// An inference layout of `experts` experts on TP x DP, with or without the EP flag; ep_degree unset when
// `ep` is negative.
InferenceConfig inference_config(int tp, int dp, bool flag, int ep, int experts) {
  InferenceConfig c;
  c.tp = tp;
  c.dp = dp;
  c.enable_expert_parallel = flag;
  if (ep >= 0) c.ep_degree = ep;
  c.num_experts = experts;
  return c;
}

TEST(RefusalFixes, EveryInferenceSuggestionIsAccepted) {
  int refused = 0, suggestions = 0;
  for (int tp = 1; tp <= 6; ++tp)
    for (int dp = 1; dp <= 4; ++dp)
      for (bool flag : {false, true})
        for (int ep = -1; ep <= 9; ++ep)
          for (int experts : {1, 2, 3, 4, 6, 8, 12, 16})
            for (int intermediate : {0, 6}) {
              InferenceConfig c = inference_config(tp, dp, flag, ep, experts);
              c.intermediate = intermediate;
              if (check_layout(c, 64, &suggestions)) ++refused;
            }
  EXPECT_GT(refused, 2000);
  EXPECT_GT(suggestions, refused);
}

// Redundant experts (issue #36): the slots must divide over ep_degree, EP must be on, R >= 0, and the EPLB
// placement replaces round-robin; each refusal suggests values that are accepted.
TEST(RefusalFixes, EveryRedundantExpertSuggestionIsAccepted) {
  int refused = 0, suggestions = 0, accepted_with_replicas = 0;
  for (int tp = 1; tp <= 4; ++tp)
    for (int dp = 1; dp <= 2; ++dp)
      for (bool flag : {false, true})
        for (int ep : {-1, 1, 2, 4})
          for (int experts : {3, 4, 6, 8})
            for (int redundant : {-1, 1, 2, 3, 5})
              for (PlacementKind placement : {PlacementKind::Contiguous, PlacementKind::RoundRobin}) {
                InferenceConfig c = inference_config(tp, dp, flag, ep, experts);
                c.redundant_experts = redundant;
                c.placement = placement;
                if (check_layout(c, 64, &suggestions)) {
                  ++refused;
                  continue;
                }
                const InferenceLayout layout(c);
                EXPECT_EQ(layout.placement().num_slots(), experts + redundant) << describe(c);
                ++accepted_with_replicas;
              }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted_with_replicas, 50);
  EXPECT_GT(suggestions, refused);
}

TEST(RefusalFixes, EveryTrainingLayoutSuggestionIsAccepted) {
  int refused = 0, suggestions = 0;
  for (int w = 1; w <= 12; ++w)
    for (int me = 0; me <= 12; ++me)
      for (int cp = 0; cp <= 4; ++cp)
        for (int tp = 1; tp <= 3; ++tp)
          for (int pp = 1; pp <= 3; ++pp)
            for (int experts : {0, 4, 6, 16})
              for (auto [layers, heads] : {std::pair{0, 0}, {6, 4}}) {
                const TrainingLayoutConfig c{w, me, cp, tp, pp, experts, layers, heads, "m"};
                if (check_layout(c, 2 * w, &suggestions)) ++refused;
              }
  EXPECT_GT(refused, 10000);
  EXPECT_GT(suggestions, refused);
}

// A plan validates the layout with the model's layers, heads and experts: a suggested PP, TP, C or M_E
// makes a plan.
TEST(RefusalFixes, EveryPlanSuggestionMakesAPlan) {
  int refused = 0;
  for (const char* name : {"mixtral-8x7b", "deepseek-v3"})
    for (int w = 1; w <= 16; ++w)
      for (int me : {1, 2, 3, 4, 16})
        for (int cp : {1, 2})
          for (int tp : {1, 3, 4})
            for (int pp : {1, 2}) {
              PlanConfig c;
              c.model = model_preset(name);
              c.world = w;
              c.ep_mp = me;
              c.cp = cp;
              c.tp = tp;
              c.pp = pp;
              const TrainingLayoutConfig lc{
                  w, me, cp, tp, pp, c.model.num_experts, c.model.layers, c.model.heads, c.model.name};
              const std::optional<LayoutRefusal> r = training_layout_refusal(lc);
              if (!r) {
                EXPECT_NO_THROW(make_plan(c)) << describe(lc);
                continue;
              }
              ++refused;
              SCOPED_TRACE(describe(lc) + "\n" + r->message());
              try {
                make_plan(c);
                ADD_FAILURE() << "a plan for a refused layout";
              } catch (const Error& e) {
                EXPECT_EQ(e.what(), r->message());
              }
              ASSERT_FALSE(r->fixes.empty());
              for (const LayoutFix& fix : r->fixes)
                for (int v : fix.values)
                  EXPECT_NO_THROW(make_plan(apply(c, fix, v))) << fix.setting << "=" << v;
            }
  EXPECT_GT(refused, 200);
}

std::string error_of(const InferenceConfig& c) {
  try {
    (void)InferenceLayout(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The reported case: with DP > 1 on 6 experts the default ep_degree TP*DP = 4 does not divide them; EP groups
// inside one replica (ep_degree 1 or TP) do, and so does a DP whose TP*DP divides 6.
TEST(RefusalFixes, CrossDpEpOnSixExpertsOffersEpGroupsOfOneReplica) {
  InferenceConfig c = inference_config(2, 2, true, -1, 6);
  std::string msg = error_of(c);  // default ep_degree = TP*DP = 4
  EXPECT_THAT(msg, HasSubstr("num_experts=6 is not divisible by ep_degree=4"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2}"));
  EXPECT_THAT(msg, HasSubstr("choose data_parallel_size in {1,3}"));
  c.ep_degree = 2;  // full EP inside each replica
  EXPECT_EQ(error_of(c), "");
}

// Partial cross-DP EP: a given ep_degree = g * TP joins g replicas, so DP must be a multiple of g, which the
// fix says without listing an endless set; an ep_degree that neither divides TP nor is a multiple of it
// would split a replica between EP groups.
TEST(RefusalFixes, PartialCrossDpEpNamesTheReplicasOfAGroup) {
  InferenceConfig c = inference_config(2, 3, true, 4, 8);
  std::string msg = error_of(c);
  EXPECT_THAT(msg, HasSubstr("world_size=6 (TP*DP=2*3) is not divisible by ep_degree=4"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2}"));
  EXPECT_THAT(msg, HasSubstr("choose data_parallel_size in {2,4,6,...} (any multiple of 2)"));
  c.tp = 6;
  c.dp = 2;
  c.num_experts = 12;
  msg = error_of(c);
  EXPECT_THAT(msg, HasSubstr("ep_degree=4 with tensor_parallel_size=6 and data_parallel_size=2: an EP group "
                             "must lie inside one DP replica (ep_degree dividing TP=6) or join whole DP "
                             "replicas (ep_degree = g*TP with g dividing DP=2)"));
  EXPECT_THAT(msg, HasSubstr("choose ep_degree in {1,2,3,6,12}"));
}

// The intermediate split is part of the layout's validation: TP = 4 without EP cannot split 6 columns, and
// the fix is expert parallelism (whole experts per rank), not an ep_degree without the flag.
TEST(RefusalFixes, AnIntermediateTheEpTpGroupCannotSplitNamesTheFlag) {
  InferenceConfig c = inference_config(4, 1, false, -1, 8);
  c.intermediate = 6;
  const std::string msg = error_of(c);
  EXPECT_THAT(msg, HasSubstr("expert intermediate size 6 is not divisible by the 4 ranks of an EP_TP group"));
  EXPECT_THAT(msg, HasSubstr("pass --enable-expert-parallel"));
  // intermediate_shard of a layout built without the size refuses with the same message.
  c.intermediate = 0;
  std::string shard;
  try {
    (void)InferenceLayout(c).intermediate_shard(0, 6);
  } catch (const Error& e) {
    shard = e.what();
  }
  EXPECT_EQ(shard, msg);
}

// The training placement's suggestion folds D*C: with W = 4 ranks and 6 experts, M_E = 3 or 6 divides the
// experts but not the ranks of a stage.
TEST(RefusalFixes, TrainingPlacementSuggestsOnlyWhatTheRanksAccept) {
  std::string msg;
  try {
    (void)TrainingLayout(4, 4, 2).expert_placement(6);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_THAT(msg, HasSubstr("num_experts=6 is not divisible by EP_MP degree M_E=4"));
  EXPECT_THAT(msg, HasSubstr("choose M_E in {1,2}"));
}

}  // namespace
}  // namespace expar
