// The plan behind `expar plan`: model presets, equation 9, buffers, traffic and every layout error. Expected
// values are hand computations written out in the comments, not calls into the code under test.
#include "expar/topo/plan.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "expar/core/error.hpp"
#include "expar/topo/model_shapes.hpp"
#include "expar/topo/plan_format.hpp"

namespace expar {
namespace {

using ::testing::HasSubstr;

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

PlanConfig config_for(const std::string& preset, int world, int ep) {
  PlanConfig c;
  c.model = model_preset(preset);
  c.world = world;
  c.ep_mp = ep;
  return c;
}

// Totals published with each model (model cards / papers); our counts must agree to within 1% (active: 3%).
// Our active count includes the input embedding; the gpt-oss card's 5.13B active leaves it out, so the
// expected value adds it back: 5.13e9 + 201088 * 2880 (579,133,440) = 5.71e9.
TEST(ModelShapes, PresetTotalsMatchPublishedSizes) {
  struct Expect {
    const char* name;
    double total, active;
  };
  const Expect expected[] = {
      {"olmoe-1b-7b", 6.92e9, 1.28e9},  {"mixtral-8x7b", 46.70e9, 12.88e9},
      {"qwen3-30b-a3b", 30.5e9, 3.3e9}, {"gpt-oss-120b", 116.83e9, 5.71e9},
      {"deepseek-v3", 671e9, 37e9},
  };
  for (const auto& e : expected) {
    const ModelShape& m = model_preset(e.name);
    EXPECT_NO_THROW(validate(m));
    EXPECT_NEAR(static_cast<double>(total_params(m)), e.total, 0.01 * e.total) << e.name;
    EXPECT_NEAR(static_cast<double>(active_params(m)), e.active, 0.03 * e.active) << e.name;
  }
  // Mixtral, exactly: per layer attention 2*4096*4096 + 2*4096*1024 = 41,943,040, norms 8,192, router
  // 8*4096 = 32,768, experts 8 * 3*4096*14336 = 1,409,286,144 -> 1,451,270,144; x32 = 46,440,644,608;
  // + embedding and LM head 2 * 32000*4096 = 262,144,000 + final norm 4,096 = 46,702,792,704.
  EXPECT_EQ(total_params(model_preset("mixtral-8x7b")), 46'702'792'704);
  EXPECT_EQ(model_preset("deepseek-v3").dense_layers, 3);
  EXPECT_EQ(model_preset("deepseek-v3").moe_layers(), 58);
  EXPECT_EQ(model_preset_names().size(), 5u);
}

TEST(ModelShapes, UnknownPresetAndBadShapes) {
  const auto msg = error_of([] { model_preset("gpt-5"); });
  EXPECT_THAT(msg, HasSubstr("'gpt-5' is unknown"));
  EXPECT_THAT(msg, HasSubstr("olmoe-1b-7b, mixtral-8x7b, qwen3-30b-a3b, gpt-oss-120b, deepseek-v3"));
  ModelShape m = model_preset("mixtral-8x7b");
  m.top_k = 9;
  EXPECT_THAT(error_of([&] { validate(m); }), HasSubstr("top_k=9 exceeds num_experts=8"));
  m = model_preset("mixtral-8x7b");
  m.kv_heads = 5;
  EXPECT_THAT(error_of([&] { validate(m); }), HasSubstr("heads=32 is not a multiple of kv_heads=5"));
  m = model_preset("mixtral-8x7b");
  m.dense_layers = 32;
  EXPECT_THAT(error_of([&] { validate(m); }), HasSubstr("dense_layers=32 must be in [0, layers=32)"));
}

// Equation 9 by hand for Mixtral-8x7B at M_E = 2 (W = 2, PP = 1):
//   one expert = 3 * d * h = 3 * 4096 * 14336 = 176,160,768 elements
//   P_E = 32 layers * 8 experts * 176,160,768 = 45,097,156,608
//   per rank: E_L = 8 / 2 = 4 experts, 32 * 4 * 176,160,768 = 22,548,578,304 = P_E / 2
//   bf16 weights: 2 bytes each = 45,097,156,608 bytes; f32 gradients: 90,194,313,216 bytes.
TEST(Plan, Equation9ByHandForMixtral) {
  const Plan p = make_plan(config_for("mixtral-8x7b", 2, 2));
  EXPECT_EQ(p.routed_expert_params, 45'097'156'608);
  EXPECT_EQ(p.local_experts, 4);
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].expert_params, 22'548'578'304);
  EXPECT_EQ(p.stages[0].expert_weight_bytes, 45'097'156'608);
  EXPECT_EQ(p.stages[0].expert_grad_bytes, 90'194'313'216);
}

// The demo: OLMoE-1B-7B, W = 8, M_E = 4, so D = 8, D_E = 2; T = 4096, K = 8, N = 64, d = 2048, factor 1.25.
TEST(Plan, OlmoeDemoByHand) {
  const Plan p = make_plan(config_for("olmoe-1b-7b", 8, 4));
  EXPECT_EQ(p.layout.dp, 8);
  EXPECT_EQ(p.layout.ep_dp, 2);
  EXPECT_EQ(p.local_experts, 16);
  const StagePlan& s = p.stages[0];
  // expert params: 16 layers * 16 local experts * 3*2048*1024 (6,291,456) = 1,610,612,736
  EXPECT_EQ(s.expert_params, 1'610'612'736);
  // dense params: per layer attention 4*2048*2048 + q/k norms 4096 = 16,781,312, norms 4,096, router
  // 64*2048 = 131,072 -> 16,916,480; x16 = 270,663,680; + embedding + LM head 2*50304*2048 = 206,045,184
  // + final norm 2,048 = 476,710,912
  EXPECT_EQ(s.dense_params, 476'710'912);
  EXPECT_EQ(s.dense_weight_bytes, 953'421'824);  // bf16
  EXPECT_EQ(s.dense_grad_bytes, 1'906'843'648);  // f32
  // optimizer: Adam 2 * 4 bytes + f32 master 4 = 12 bytes per parameter
  EXPECT_EQ(s.expert_optimizer_bytes, 19'327'352'832);
  EXPECT_EQ(s.dense_optimizer_bytes, 5'720'530'944);
  // symmetric buffers come from the trainer's sizing (train/plan_buffers.hpp, its own test): none here
  EXPECT_EQ(s.symmetric_bytes, 0);
  EXPECT_EQ(s.total_bytes,
            953'421'824 + 3'221'225'472 + 1'906'843'648 + 6'442'450'944 + 5'720'530'944 + 19'327'352'832);
  // traffic: 4096*8 routes * 3/4 remote * 2048 * 2 bytes = 100,663,296 per layer and microbatch
  EXPECT_EQ(s.dispatch_bytes_per_layer, 100'663'296);
  EXPECT_EQ(s.combine_bytes_per_layer, 100'663'296);
  // step: 2 (fwd+bwd) * (dispatch + combine) * 16 layers * 1 microbatch
  EXPECT_EQ(s.ep_bytes_per_step, 2 * 2 * 100'663'296LL * 16);
  // ring all-reduce: expert grads 6,442,450,944 over D_E=2 -> x 2*1/2; dense 1,906,843,648 over 8 -> x 2*7/8
  EXPECT_EQ(s.expert_grad_reduce_bytes, 6'442'450'944);
  EXPECT_EQ(s.dense_grad_reduce_bytes, 3'336'976'384);
}

TEST(Plan, ShardedOptimizerAndFitCheck) {
  PlanConfig c = config_for("olmoe-1b-7b", 8, 4);
  c.shard_optimizer = true;
  // total: 953,421,824 + 3,221,225,472 + 1,906,843,648 + 6,442,450,944 + 9,663,676,416 + 715,066,368
  //        + 2 * 167,772,160 = 23,238,228,992 bytes (21.64 GiB)
  c.device_memory_bytes = 24LL << 30;
  const StagePlan s = make_plan(c).stages[0];
  EXPECT_EQ(s.expert_optimizer_bytes, 1'610'612'736LL / 2 * 12);  // over D_E = 2
  EXPECT_EQ(s.dense_optimizer_bytes, 476'710'912LL / 8 * 12);     // over D*C = 8
  EXPECT_TRUE(s.fits);                                            // ~13.5 GiB
  c.device_memory_bytes = 8LL << 30;
  EXPECT_FALSE(make_plan(c).stages[0].fits);
}

TEST(Plan, NoEpMeansNoTokenTraffic) {
  const StagePlan s = make_plan(config_for("qwen3-30b-a3b", 4, 1)).stages[0];
  EXPECT_EQ(s.dispatch_bytes_per_layer, 0);
  EXPECT_EQ(s.ep_bytes_per_step, 0);
  // Every rank holds all 128 experts of all 48 layers: 48 * 128 * 3*2048*768 = 28,991,029,248
  EXPECT_EQ(s.expert_params, 28'991'029'248);
}

// Mixtral, PP = 4 (8 layers per stage), W = 8, M_E = 2: the embedding sits on stage 0, the LM head and final
// norm on stage 3. Per layer dense: 41,943,040 + 8,192 + 32,768 = 41,984,000; x8 = 335,872,000.
TEST(Plan, PipelineStagesSplitLayersEmbeddingAndHead) {
  PlanConfig c = config_for("mixtral-8x7b", 8, 2);
  c.pp = 4;
  const Plan p = make_plan(c);
  ASSERT_EQ(p.stages.size(), 4u);
  EXPECT_EQ(p.stages[0].dense_params, 335'872'000 + 131'072'000);
  EXPECT_EQ(p.stages[1].dense_params, 335'872'000);
  EXPECT_EQ(p.stages[3].dense_params, 335'872'000 + 131'072'000 + 4096);
  EXPECT_EQ(p.stages[2].first_layer, 16);
  EXPECT_EQ(p.stages[2].end_layer, 24);
  EXPECT_EQ(p.stages[1].expert_params, 8LL * 4 * 176'160'768);
  EXPECT_EQ(p.layout.ep_dp, 1);
  EXPECT_EQ(p.stages[1].expert_grad_reduce_bytes, 0);  // one replica: nothing to reduce
}

// Dense first layers (DeepSeek-V3 style) land on the first stage; a stage of only dense layers moves no rows.
TEST(Plan, DenseLayersFallOnTheFirstStage) {
  PlanConfig c = config_for("deepseek-v3", 2, 1);
  c.model.layers = 4;
  c.pp = 2;
  const Plan p = make_plan(c);
  EXPECT_EQ(p.stages[0].dense_mlp_layers, 2);
  EXPECT_EQ(p.stages[0].moe_layers, 0);
  EXPECT_EQ(p.stages[0].expert_params, 0);
  EXPECT_EQ(p.stages[1].dense_mlp_layers, 1);
  EXPECT_EQ(p.stages[1].moe_layers, 1);
  EXPECT_EQ(p.stages[1].expert_params, 256LL * 3 * 7168 * 2048);
}

TEST(Plan, TensorParallelSplitsDenseWeightsOnly) {
  PlanConfig c = config_for("mixtral-8x7b", 4, 2);
  c.tp = 2;
  const StagePlan s = make_plan(c).stages[0];
  // (32 * 41,943,040 + 262,144,000) / 2 + 32 * (8,192 + 32,768) + 4,096 replicated
  EXPECT_EQ(s.dense_params, (32LL * 41'943'040 + 262'144'000) / 2 + 32 * (8192 + 32768) + 4096);
  EXPECT_EQ(s.expert_params, 32LL * 4 * 176'160'768);
}

TEST(Plan, RingAllReduceBytes) {
  EXPECT_EQ(ring_allreduce_bytes(1000, 4), 1500);
  EXPECT_EQ(ring_allreduce_bytes(1000, 1), 0);
  EXPECT_EQ(ring_allreduce_bytes(3'000'000'000'000'000'000LL, 2), 3'000'000'000'000'000'000LL);
}

TEST(Plan, ImpossibleLayoutsAreErrors) {
  auto msg = error_of([] { make_plan(config_for("mixtral-8x7b", 16, 16)); });
  EXPECT_THAT(msg,
              HasSubstr("num_experts=8 is not divisible by EP_MP degree M_E=16: choose M_E in {1,2,4,8}"));

  msg = error_of([] { make_plan(config_for("olmoe-1b-7b", 8, 3)); });
  EXPECT_THAT(msg, HasSubstr("M_E=3"));
  EXPECT_THAT(msg, HasSubstr("choose M_E in {1,2,4,8}"));

  PlanConfig c = config_for("deepseek-v3", 4, 2);
  c.pp = 2;
  msg = error_of([&] { make_plan(c); });
  EXPECT_THAT(msg, HasSubstr("PP=2 does not divide the 61 layers of 'deepseek-v3'"));
  // 61 stages would divide the layers but not the 4 ranks.
  EXPECT_THAT(msg, HasSubstr(": set PP=1"));

  c = config_for("mixtral-8x7b", 6, 2);
  c.tp = 3;
  msg = error_of([&] { make_plan(c); });
  EXPECT_THAT(msg, HasSubstr("TP=3 does not divide the 32 attention heads"));
  // TP must divide both the 32 heads and the 6 ranks.
  EXPECT_THAT(msg, HasSubstr("choose TP in {1,2}"));

  c = config_for("mixtral-8x7b", 6, 2);
  c.tp = 4;
  EXPECT_THAT(error_of([&] { make_plan(c); }), HasSubstr("W=6 is not divisible by C*TP*PP=1*4*1=4"));

  c = config_for("mixtral-8x7b", 2, 2);
  c.capacity_factor = -1;
  EXPECT_THAT(error_of([&] { make_plan(c); }), HasSubstr("capacity factor -1 must be a positive number"));
  c = config_for("mixtral-8x7b", 2, 2);
  c.tokens_per_rank = 0;
  EXPECT_THAT(error_of([&] { make_plan(c); }), HasSubstr("T=0 must be at least 1"));

  EXPECT_THAT(error_of([] { plan_dtype_from_name("fp4"); }), HasSubstr("precision 'fp4' is unknown"));
  EXPECT_EQ(plan_dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(plan_dtype_from_name("fp8"), DType::F8E4M3);
}

TEST(PlanFormat, JsonAndTableCarryThePlan) {
  const Plan p = make_plan(config_for("olmoe-1b-7b", 8, 4));
  const nlohmann::json j = nlohmann::json::parse(plan_to_json(p).dump());
  EXPECT_EQ(j["layout"]["ep_dp"], 2);
  EXPECT_EQ(j["layout"]["groups"]["ep_mp"], nlohmann::json::parse("[[0,1,2,3],[4,5,6,7]]"));
  EXPECT_EQ(j["layout"]["groups"]["ep_dp"], nlohmann::json::parse("[[0,4],[1,5],[2,6],[3,7]]"));
  EXPECT_EQ(j["stages"][0]["bytes_per_rank"]["expert_weights"].get<int64_t>(), 3'221'225'472);
  EXPECT_EQ(j["stages"][0]["comm_bytes_per_rank"]["dispatch_per_layer_microbatch"].get<int64_t>(),
            100'663'296);
  EXPECT_EQ(j["params"]["routed_experts_per_rank_eq9"].get<int64_t>(), 6'442'450'944 / 4);
  EXPECT_THAT(j["reduction_algorithm"].get<std::string>(), HasSubstr("2(n-1)/n"));
  const std::string table = format_plan_table(p);
  EXPECT_THAT(table, HasSubstr("EP_DP groups (expert gradients): {0,4} {1,5} {2,6} {3,7}"));
  EXPECT_THAT(table, HasSubstr("3.00 GiB"));  // expert weights, 3,221,225,472 bytes
  EXPECT_THAT(table, HasSubstr("ring all-reduce"));
}

}  // namespace
}  // namespace expar
