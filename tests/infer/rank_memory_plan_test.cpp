// The memory plan of an inference rank (infer/rank_memory_plan.hpp) against what loading really allocates:
// for every family's storage (ours F32 with the embedding mapped in place, Mixtral and tied Qwen3-MoE in
// BF16, Qwen-MoE in F32 with a gated shared expert, gpt-oss with MXFP4 experts held as stored or widened) on
// TP, full, variable, cross-DP and partial cross-DP EP layouts (TP 1 x DP 4 with EP groups of 2 replicas; TP
// 2 x DP 2 with EP inside each replica) and with redundant experts, each rank's planned dense, expert and
// mapped bytes equal its tracker's after load_rank_weights, and its KV bytes a sequence's cache. Then the
// refusal before loading: its message names the bytes and a fix that the same check then accepts.
#include "expar/infer/rank_memory_plan.hpp"

#include <gtest/gtest.h>

#include "common/temp_dir.hpp"
#include "core/expect_error.hpp"
#include "deepseek_test_model.hpp"
#include "expar/infer/engine.hpp"
#include "expar/model/moe_transformer.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;

struct Layout {
  int tp, dp;
  bool ep;
  std::optional<int> ep_degree;
  int redundant = 0;  // --redundant-experts: replicas' weights are counted like any slot's
};

void expect_plan_matches_load(const fs::path& dir, const std::string& family,
                              std::optional<DType> weight_dtype = std::nullopt) {
  const ModelSpec spec = open_model_spec(dir);
  for (const Layout& l : {Layout{1, 1, false, {}}, Layout{2, 1, false, {}}, Layout{2, 1, true, {}},
                          Layout{4, 1, true, 2}, Layout{2, 2, true, {}}, Layout{2, 1, true, {}, 4},
                          Layout{2, 2, true, {}, 4}, Layout{1, 4, true, 2}, Layout{2, 2, true, 2, 2}}) {
    const InferenceLayout layout =
        make_layout(l.tp, l.dp, l.ep, l.ep_degree, spec.config.moe.router.num_experts,
                    PlacementKind::Contiguous, l.redundant);
    const std::vector<RankMemoryPlan> plans = plan_inference_memory(spec, layout, 9, weight_dtype);
    ASSERT_EQ(plans.size(), static_cast<size_t>(layout.world()));
    run_ranks(layout.world(), [&](Comm& world) {
      const RankMemoryPlan& plan = plans[static_cast<size_t>(world.rank())];
      const std::string what = fmt::format("{} TP {} DP {} EP {} R {} rank {}", family, l.tp, l.dp,
                                           layout.ep_degree(), l.redundant, world.rank());
      auto store = open_store(spec);
      RankWeights w = load_rank_weights(*store, spec, layout, world.rank(), weight_dtype);
      store.reset();
      const MemorySnapshot s = current_tracker().snapshot();
      EXPECT_EQ(s.current_of(MemCategory::DenseWeights), plan.dense_bytes) << what;
      EXPECT_EQ(s.current_of(MemCategory::ExpertWeights), plan.expert_bytes) << what;
      EXPECT_EQ(s.current_of(MemCategory::MappedWeights), plan.mapped_bytes) << what;
      EXPECT_GT(plan.dense_bytes, 0) << what;
      EXPECT_EQ(plan.expert_bytes > 0, !layout.rank_info(world.rank()).local_experts.empty()) << what;
      int64_t held = 0;
      for (int64_t b : plan.held_bytes) held += b;
      EXPECT_EQ(held, plan.dense_bytes + plan.expert_bytes) << what;
      // Converted: no F32 matrix is left but the norms, router, biases and gates (a few per cent).
      if (weight_dtype == DType::BF16) {
        // Converted: no F32 matrix is left but the norms, router, biases and gates (a few per cent).
        EXPECT_GT(plan.held_bytes[static_cast<size_t>(WeightFormat::BF16)],
                  4 * plan.held_bytes[static_cast<size_t>(WeightFormat::F32)])
            << what;
      }
      if (weight_dtype == DType::F8E4M3) {
        EXPECT_GT(plan.held_bytes[static_cast<size_t>(WeightFormat::FP8)], 0) << what;
      }
      Engine engine(layout, world, std::move(w));
      engine.add_sequence(plan.kv_tokens);
      EXPECT_EQ(current_tracker().snapshot().current_of(MemCategory::KvCache), plan.kv_bytes()) << what;
    });
  }
}

TEST(RankMemoryPlan, EqualsWhatLoadingAllocates) {
  test::TempDir dir("rank_memory_plan");
  {  // ours: F32, the embedding used in place from the mapped file
    const fs::path ours = dir.path() / "expar";
    fs::create_directories(ours);
    ModelConfig config = test_config();
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(config, {}, *group);
      model.init(3);
      write_expar_checkpoint(ours, model, 2);
    });
    expect_plan_matches_load(ours, "expar");
    expect_plan_matches_load(ours, "expar as BF16", DType::BF16);
    const ModelSpec spec = open_model_spec(ours);
    EXPECT_GT(plan_inference_memory(spec, make_layout(1, 1, false, {}, 24), 0)[0].mapped_bytes, 0);
  }
  for (const char* family : {"mixtral", "tied qwen3_moe", "qwen2_moe"}) {
    const std::string f = family;
    HfTestModel m = f == "mixtral"     ? mixtral_test_model()
                    : f == "qwen2_moe" ? qwen_test_model()
                                       : tied_qwen3_moe_test_model();
    const fs::path d = dir.path() / f;
    fs::create_directories(d);
    write_sharded_checkpoint(d, bf16_rounded(m.tensors, f != "qwen2_moe"), 64 * 1024);
    std::ofstream(d / "config.json") << m.config().dump(2);
    expect_plan_matches_load(d, f);
    expect_plan_matches_load(d, f + " with --weight-dtype bf16", DType::BF16);
  }
  {  // block-scaled FP8: Mixtral's whole blocks, Qwen's ragged ones (experts widened); BF16 converted to FP8
    for (const char* family : {"mixtral", "mixtral 128", "qwen2_moe"}) {
      const std::string f = family;
      HfTestModel m = f == "mixtral"       ? mixtral_fp8_test_model()
                      : f == "mixtral 128" ? mixtral_fp8_test_model(128)
                                           : qwen_test_model();
      const fs::path d = dir.path() / ("fp8_" + f);
      fs::create_directories(d);
      write_sharded_checkpoint(d, fp8_quantised(m.tensors).stored, 256 * 1024);
      std::ofstream(d / "config.json") << fp8_config(m.config()).dump(2);
      expect_plan_matches_load(d, f + " fp8");
      const fs::path b = dir.path() / ("bf16_" + f);
      fs::create_directories(b);
      write_sharded_checkpoint(b, bf16_rounded(m.tensors, true), 256 * 1024);
      std::ofstream(b / "config.json") << m.config().dump(2);
      expect_plan_matches_load(b, f + " bf16 with --weight-dtype fp8", DType::F8E4M3);
    }
  }
  // gpt-oss, MXFP4 experts: held as stored where a shard covers whole blocks (of an intermediate of 64: whole
  // experts, and shards of 32 at TP 2), widened where not (of 32: shards of 16).
  for (const int64_t inter : {64, 32}) {
    HfTestModel m = gpt_oss_test_model(64, inter);
    const fs::path d = dir.path() / fmt::format("gpt_oss_{}", inter);
    fs::create_directories(d);
    write_sharded_checkpoint(d, quantise_gpt_oss_experts(m), 64 * 1024);
    std::ofstream(d / "config.json") << mxfp4_config(m).dump(2);
    expect_plan_matches_load(d, fmt::format("gpt-oss I {}", inter));
    const ModelSpec spec = open_model_spec(d);
    const auto whole =
        plan_inference_memory(spec, make_layout(2, 1, true, {}, static_cast<int>(m.experts)), 0);
    const auto halves =
        plan_inference_memory(spec, make_layout(2, 1, false, {}, static_cast<int>(m.experts)), 0);
    const int64_t whole_mxfp4 = whole[0].held_bytes[static_cast<size_t>(WeightFormat::MXFP4)];
    const int64_t halves_mxfp4 = halves[0].held_bytes[static_cast<size_t>(WeightFormat::MXFP4)];
    EXPECT_GT(whole_mxfp4, 0);
    // TP 2 without EP: every expert, of each half (I 64), or widened (I 32); with EP: half the experts whole.
    EXPECT_EQ(halves_mxfp4, inter == 64 ? whole_mxfp4 : 0);
    EXPECT_NE(format_held_bytes(whole[0]).find("mxfp4"), std::string::npos) << format_held_bytes(whole[0]);
  }
}

// DeepSeek: latent attention's replicated and per-head projections, dense MLP layers, ungated shared experts,
// the correction bias; F32, BF16 and FP8 as the Hub ships V3 (the latent cache: kv_lora + rope per layer).
TEST(RankMemoryPlan, DeepseekEqualsWhatLoadingAllocates) {
  test::TempDir dir("rank_memory_plan_deepseek");
  for (const bool v3 : {true, false}) {
    DeepseekTestModel m = v3 ? deepseek_v3_test_model() : deepseek_v2_test_model();
    const fs::path d = dir.path() / (v3 ? "v3" : "v2");
    fs::create_directories(d);
    m.write(d);
    expect_plan_matches_load(d, v3 ? "deepseek-v3" : "deepseek-v2");
    if (!v3) continue;
    expect_plan_matches_load(d, "deepseek-v3 with --weight-dtype bf16", DType::BF16);
    const fs::path f = dir.path() / "v3_fp8";
    fs::create_directories(f);
    write_sharded_checkpoint(f, fp8_quantised(m.tensors).stored, 64 * 1024);
    std::ofstream(f / "config.json") << fp8_config(m.config()).dump(2);
    expect_plan_matches_load(f, "deepseek-v3 fp8");
  }
  // Qwen-MoE with a dense MLP layer (mlp_only_layers).
  HfTestModel q = qwen_test_model();
  q.mlp_only_layers = {1};
  q.tensors.clear();
  q.randomize(5);
  const fs::path d = dir.path() / "qwen_dense";
  fs::create_directories(d);
  q.write(d);
  expect_plan_matches_load(d, "qwen2_moe with a dense layer");
}

TEST(RankMemoryPlan, RefusesBeforeLoadingAndNamesAFixThatFits) {
  test::TempDir dir("fit_check");
  HfTestModel m = gpt_oss_test_model(64, 32);
  write_sharded_checkpoint(dir.path(), quantise_gpt_oss_experts(m), 64 * 1024);
  std::ofstream(dir.path() / "config.json") << mxfp4_config(m).dump(2);
  const ModelSpec spec = open_model_spec(dir.path());
  auto need = [&](const GenerateOptions& o, int64_t kv) {
    int64_t total = kInferenceReserveBytes;
    for (const RankMemoryPlan& p : plan_inference_memory(spec, inference_layout(o, spec.config), kv))
      total += p.heap_bytes();
    return total;
  };
  FitRequest r;
  r.spec = &spec;
  r.options.tp = 2;  // TP 2 without EP: shards of 16 intermediate rows widen the MXFP4 experts to f32
  r.kv_tokens = 16;
  GenerateOptions ep = r.options;
  ep.enable_expert_parallel = true;
  ASSERT_LT(need(ep, 16), need(r.options, 16));
  r.options.memory_limit_bytes = need(r.options, 16);
  EXPECT_NO_THROW(check_fits_before_loading(r));  // exactly the bytes needed
  r.options.memory_limit_bytes = need(ep, 16);
  const std::string needed = format_bytes(need(r.options, 16)),
                    limit = format_bytes(r.options.memory_limit_bytes);
  expect_error([&] { check_fits_before_loading(r); },
               {"does not fit", needed.c_str(), limit.c_str(), "--memory-limit-gib",
                "run with --tp 2 --dp 1 --enable-expert-parallel"});
  FitRequest fixed = r;  // the fix it names is accepted
  fixed.options = ep;
  fixed.options.memory_limit_bytes = r.options.memory_limit_bytes;
  EXPECT_NO_THROW(check_fits_before_loading(fixed));

  // A KV cache too large beside the weights: the flag's value that fits, checked by the same rule.
  fixed.options.memory_limit_bytes = need(ep, 1000);
  fixed.kv_tokens = 4'000'000;
  int64_t offered = 0;
  fixed.kv_fix = [&](int64_t tokens) {
    offered = tokens;
    return std::optional<std::string>(fmt::format("--tokens {}", tokens));
  };
  expect_error([&] { check_fits_before_loading(fixed); }, {"does not fit", "pass --tokens"});
  EXPECT_EQ(offered, 1000);
  fixed.kv_tokens = offered;
  EXPECT_NO_THROW(check_fits_before_loading(fixed));

  // F32 weights: converting them to BF16 at load is offered where it fits, and accepted.
  {
    HfTestModel q = qwen_test_model();
    const fs::path qd = dir.path() / "qwen_f32";
    fs::create_directories(qd);
    q.write(qd);
    const ModelSpec qspec = open_model_spec(qd);
    FitRequest f;
    f.spec = &qspec;
    f.kv_tokens = 16;
    auto need_q = [&](std::optional<DType> dtype) {
      int64_t total = kInferenceReserveBytes;
      for (const RankMemoryPlan& p :
           plan_inference_memory(qspec, inference_layout(f.options, qspec.config), 16, dtype))
        total += p.heap_bytes();
      return total;
    };
    ASSERT_LT(need_q(DType::BF16), need_q(std::nullopt));
    f.options.memory_limit_bytes = need_q(DType::BF16);
    expect_error([&] { check_fits_before_loading(f); }, {"does not fit", "pass --weight-dtype bf16"});
    f.options.weight_dtype = DType::BF16;
    EXPECT_NO_THROW(check_fits_before_loading(f));
  }

  // DP 4 with every replica holding every expert: the smallest EP group that fits is named (two replicas,
  // though full EP fits too), on the threads transport and for one MPI rank, and it is accepted.
  for (bool one_rank : {false, true}) {
    FitRequest p;
    p.spec = &spec;
    p.kv_tokens = 16;
    if (one_rank) p.hosted_ranks = {0};
    p.options.dp = 4;
    p.options.enable_expert_parallel = true;
    p.options.ep_degree = 1;
    auto hosted_need = [&](const GenerateOptions& o) {
      if (!one_rank) return need(o, 16);
      return kInferenceReserveBytes +
             plan_inference_memory(spec, inference_layout(o, spec.config), 16).front().heap_bytes();
    };
    GenerateOptions pairs = p.options, full = p.options;
    pairs.ep_degree = 2;
    full.ep_degree.reset();
    ASSERT_LT(hosted_need(full), hosted_need(pairs));
    ASSERT_LT(hosted_need(pairs), hosted_need(p.options));
    p.options.memory_limit_bytes = pairs.memory_limit_bytes = hosted_need(pairs);
    expect_error([&] { check_fits_before_loading(p); },
                 {"does not fit", "run with --tp 1 --dp 4 --enable-expert-parallel --ep 2"});
    p.options = pairs;
    EXPECT_NO_THROW(check_fits_before_loading(p));
  }

  // Weights alone over the limit: no fix here.
  r.options.memory_limit_bytes = kInferenceReserveBytes + 1;
  r.kv_fix = fixed.kv_fix;
  expect_error([&] { check_fits_before_loading(r); }, {"does not fit", "no layout of this process holds it"});
}

}  // namespace
}  // namespace expar::infer
