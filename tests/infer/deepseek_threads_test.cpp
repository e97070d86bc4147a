// DeepSeek-V3 and DeepSeek-V2 end to end (deepseek_test_model.hpp's checkpoints and dense double reference):
//  - config.json read into the architecture (latent attention dims, softmax scale with mscale_all_dim, the
//    routers, shared experts, dense layers, the multi-token-prediction layer ignored);
//  - the single-rank engine's prefill (expanded latent attention) and decode (absorbed) logits against the
//    reference within 1e-5 of the logits' scale, for V3 and V2's greedy and group-limited routers;
//  - the expanded and absorbed forms forced on every step give the same logits;
//  - every layout of TP 1..4 x {no EP, full EP, variable EP} x DP {1, 2} gives the single rank's logits and
//    greedy tokens;
//  - FP8 block-scaled weights held as stored give the logits of the F32 values they encode;
//  - the compressed cache: kv_lora_rank + qk_rope_head_dim floats per layer and position.
#include <gtest/gtest.h>

#include "core/expect_error.hpp"
#include "deepseek_test_model.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/rank_memory_plan.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;

constexpr int kDecodeSteps = 3;

struct Checkpoint {
  DeepseekTestModel model;
  fs::path dir;
  ModelSpec spec;
};

Checkpoint write_checkpoint(DeepseekTestModel m, const std::string& name) {
  Checkpoint c{std::move(m), test::run_temp_dir(name), {}};
  c.model.write(c.dir);
  c.spec = open_model_spec(c.dir);
  return c;
}

const Checkpoint& v3() {
  static const Checkpoint c = write_checkpoint(deepseek_v3_test_model(), "deepseek_v3");
  return c;
}

// Prefill logits of each prompt (all rows) then kDecodeSteps greedy decode steps' logits, one engine per
// rank of `layout`; every DP replica runs the same prompts. Returns rank 0's.
struct EngineRun {
  std::vector<Tensor> prefill;               // per prompt [len, V]
  std::vector<std::vector<Tensor>> decode;   // per prompt, per step [1, V]
  std::vector<std::vector<int32_t>> greedy;  // per prompt: the prefill's argmax, then each step's
};

EngineRun run_engine(const ModelSpec& spec, const InferenceLayout& layout,
                     const std::vector<std::vector<int32_t>>& prompts, EngineOptions options = {}) {
  EngineRun out;
  MemoryTracker& host = current_tracker();
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()), options);
    std::vector<int> ids;
    for (size_t p = 0; p < prompts.size(); ++p) ids.push_back(engine.add_sequence(spec.config.max_seq));
    Tensor logits = engine.prefill(ids, prompts);
    EngineRun mine;
    int64_t row = 0;
    std::vector<int32_t> next;
    for (const auto& p : prompts) {
      const auto n = static_cast<int64_t>(p.size());
      mine.prefill.push_back(export_to(host, logits.rows(row, row + n).clone()));
      next.push_back(argmax_row(logits, row + n - 1));
      mine.greedy.push_back({next.back()});
      mine.decode.emplace_back();
      row += n;
    }
    for (int i = 0; i < kDecodeSteps; ++i) {
      Tensor step = engine.decode(ids, next);
      for (size_t p = 0; p < prompts.size(); ++p) {
        mine.decode[p].push_back(
            export_to(host, step.rows(static_cast<int64_t>(p), static_cast<int64_t>(p) + 1).clone()));
        next[p] = argmax_row(step, static_cast<int64_t>(p));
        mine.greedy[p].push_back(next[p]);
      }
    }
    if (world.rank() == 0) out = std::move(mine);
  });
  return out;
}

std::vector<std::vector<int32_t>> prompts_of(const DeepseekTestModel& m) {
  return {vocab_tokens(1, 7, m.vocab), vocab_tokens(2, 4, m.vocab)};
}

InferenceLayout single(const ModelSpec& spec) {
  return make_layout(1, 1, false, std::nullopt, spec.config.moe.router.num_experts);
}

// The run against the dense reference: prefill rows, and each decode step against the whole prefix.
void expect_matches_reference(const DeepseekTestModel& m, const EngineRun& run,
                              const std::vector<std::vector<int32_t>>& prompts) {
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int32_t> seq = prompts[p];
    EXPECT_TRUE(close(run.prefill[p], m.dense_logits(seq))) << "prefill, prompt " << p;
    for (int i = 0; i < kDecodeSteps; ++i) {
      seq.push_back(run.greedy[p][static_cast<size_t>(i)]);
      const Tensor dense = m.dense_logits(seq);
      EXPECT_TRUE(
          close(run.decode[p][static_cast<size_t>(i)], dense.rows(dense.dim(0) - 1, dense.dim(0)).clone()))
          << "decode step " << i << ", prompt " << p;
    }
  }
}

TEST(Deepseek, ConfigIsReadIntoTheArchitecture) {
  const ModelSpec& s = v3().spec;
  EXPECT_EQ(s.format, ModelFormat::DeepseekV3);
  const LatentAttentionDims& a = s.features.mla;
  EXPECT_TRUE(a.enabled());
  EXPECT_EQ(a.q_lora_rank, 12);
  EXPECT_EQ(a.kv_lora_rank, 16);
  EXPECT_EQ(a.qk_nope_head_dim, 6);
  EXPECT_EQ(a.qk_rope_head_dim, 4);
  EXPECT_EQ(a.v_head_dim, 5);
  EXPECT_TRUE(a.rope_interleave);
  EXPECT_NEAR(a.softmax_scale, v3().model.softmax_scale(), 1e-15);
  EXPECT_NE(a.softmax_scale, 1.0 / std::sqrt(10.0));  // mscale_all_dim matters
  EXPECT_EQ(s.config.head_dim, 4);
  const RouterConfig& r = s.config.moe.router;
  EXPECT_EQ(r.score, ScoreFunction::Sigmoid);
  EXPECT_TRUE(r.renormalize);
  EXPECT_EQ(r.n_group, 4);
  EXPECT_EQ(r.topk_group, 2);
  EXPECT_EQ(r.routed_scale, 2.5);
  EXPECT_TRUE(s.config.moe.use_score_bias);
  EXPECT_EQ(s.config.shared_expert_hidden, 16);
  EXPECT_FALSE(s.features.shared_expert_gate);
  EXPECT_EQ(s.features.dense_mlp, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(s.features.dense_mlp_hidden, 24);
  EXPECT_EQ(s.features.ignored_mtp_layers, 1);
}

TEST(Deepseek, V3SingleRankEngineMatchesTheDenseReference) {
  const auto prompts = prompts_of(v3().model);
  expect_matches_reference(v3().model, run_engine(v3().spec, single(v3().spec), prompts), prompts);
}

TEST(Deepseek, V2GreedyAndGroupLimitedMatchTheDenseReference) {
  for (const char* method : {"greedy", "group_limited_greedy"}) {
    const Checkpoint c =
        write_checkpoint(deepseek_v2_test_model(method), std::string("deepseek_v2_") + method);
    EXPECT_EQ(c.spec.config.moe.router.score, ScoreFunction::Softmax);
    EXPECT_EQ(c.spec.config.moe.router.n_group, std::string(method) == "greedy" ? 1 : 4) << method;
    EXPECT_FALSE(c.spec.config.moe.use_score_bias);
    const auto prompts = prompts_of(c.model);
    expect_matches_reference(c.model, run_engine(c.spec, single(c.spec), prompts), prompts);
    fs::remove_all(c.dir);
  }
}

TEST(Deepseek, ExpandedAndAbsorbedFormsGiveTheSameLogits) {
  const auto prompts = prompts_of(v3().model);
  EngineOptions expanded, absorbed;
  expanded.latent_form = nn::LatentForm::Expanded;
  absorbed.latent_form = nn::LatentForm::Absorbed;
  const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, 8);
  const EngineRun a = run_engine(v3().spec, layout, prompts, expanded),
                  b = run_engine(v3().spec, layout, prompts, absorbed);
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_TRUE(close(a.prefill[p], b.prefill[p])) << p;
    EXPECT_EQ(a.greedy[p], b.greedy[p]);
    for (int i = 0; i < kDecodeSteps; ++i)
      EXPECT_TRUE(close(a.decode[p][i], b.decode[p][i])) << p << " " << i;
  }
}

struct LayoutCase {
  int tp, dp;
  bool ep;
  std::optional<int> ep_degree;
};

TEST(Deepseek, EveryLayoutGivesTheSingleRankLogits) {
  const auto prompts = prompts_of(v3().model);
  const EngineRun want = run_engine(v3().spec, single(v3().spec), prompts);
  for (const LayoutCase& c : std::vector<LayoutCase>{{2, 1, false, {}},
                                                     {4, 1, false, {}},
                                                     {2, 1, true, {}},
                                                     {4, 1, true, {}},
                                                     {4, 1, true, 2},
                                                     {1, 2, true, {}},
                                                     {2, 2, true, {}},
                                                     {2, 2, false, {}}}) {
    const std::string name =
        fmt::format("TP {} DP {} EP {} degree {}", c.tp, c.dp, c.ep, c.ep_degree.value_or(0));
    const EngineRun got = run_engine(v3().spec, make_layout(c.tp, c.dp, c.ep, c.ep_degree, 8), prompts);
    for (size_t p = 0; p < prompts.size(); ++p) {
      EXPECT_TRUE(close(got.prefill[p], want.prefill[p])) << name << ", prompt " << p;
      EXPECT_EQ(got.greedy[p], want.greedy[p]) << name;
      for (int i = 0; i < kDecodeSteps; ++i)
        EXPECT_TRUE(close(got.decode[p][i], want.decode[p][i])) << name << ", step " << i;
    }
  }
}

// Redundant experts (issue #36): a layout whose EP partitions hold slots, some experts in two of them, gives
// the single rank's logits (within 1e-5: a replica's rows share other products than on one rank), and both
// replicas of a replicated expert compute rows.
TEST(Deepseek, RedundantExpertSlotsGiveTheSingleRankLogits) {
  const auto prompts = prompts_of(v3().model);
  const EngineRun want = run_engine(v3().spec, single(v3().spec), prompts);
  struct SlotCase {
    int tp;
    std::vector<int> slots;
  };
  for (const SlotCase& c : std::vector<SlotCase>{{2, {0, 1, 2, 3, 4, 5, 6, 7, 0, 1}},
                                                 {4, {0, 1, 2, 3, 4, 5, 6, 7, 2, 5, 0, 3}}}) {
    GenerateOptions o;
    o.tp = c.tp;
    o.enable_expert_parallel = true;
    o.expert_slots = c.slots;
    const InferenceLayout layout = inference_layout(o, v3().spec.config);
    EXPECT_EQ(layout.placement().num_slots(), static_cast<int>(c.slots.size()));
    const EngineRun got = run_engine(v3().spec, layout, prompts);
    for (size_t p = 0; p < prompts.size(); ++p) {
      EXPECT_TRUE(close(got.prefill[p], want.prefill[p])) << "TP " << c.tp << ", prompt " << p;
      EXPECT_EQ(got.greedy[p], want.greedy[p]) << "TP " << c.tp;
      for (int i = 0; i < kDecodeSteps; ++i)
        EXPECT_TRUE(close(got.decode[p][i], want.decode[p][i])) << "TP " << c.tp << ", step " << i;
    }
  }
  // Both replicas of experts 0 and 1 (slots 0, 1 on rank 0 and 8, 9 on rank 1) compute rows: the rows of each
  // replicated expert split within 1 between them, layer by layer (so within 2 over the 2 MoE layers).
  GenerateOptions o;
  o.tp = 2;
  o.enable_expert_parallel = true;
  o.expert_slots = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1};
  const InferenceLayout layout = inference_layout(o, v3().spec.config);
  std::vector<std::vector<int64_t>> rows(2);
  run_ranks(2, [&](Comm& world) {
    auto store = open_store(v3().spec);
    Engine engine(layout, world, load_rank_weights(*store, v3().spec, layout, world.rank()));
    std::vector<int> ids;
    for (size_t p = 0; p < prompts.size(); ++p) ids.push_back(engine.add_sequence(16));
    engine.prefill(ids, prompts);
    rows[static_cast<size_t>(world.rank())] = engine.stats().expert_tokens;
  });
  int64_t replicated_rows = 0;
  for (int e : {0, 1}) {
    replicated_rows += rows[0][e] + rows[1][e];
    EXPECT_LE(std::abs(rows[0][e] - rows[1][e]), 2) << "expert " << e;
  }
  EXPECT_GE(replicated_rows, 4);  // the check above is not vacuous
  // Slots that do not divide over the partitions are refused naming them.
  GenerateOptions bad;
  bad.tp = 4;
  bad.enable_expert_parallel = true;
  bad.expert_slots = {0, 1, 2, 3, 4, 5, 6, 7, 0};
  expect_error([&] { inference_layout(bad, v3().spec.config); }, {"9 expert slots", "ep_degree=4"});
}

// DeepSeek-V3 as the Hub ships it: block-scaled FP8 projections (the latent attention's, experts, shared
// experts, dense MLP) with F32 scales; held as stored, they give the logits of the values they encode.
TEST(Deepseek, Fp8WeightsHeldAsStoredGiveTheLogitsOfTheirValues) {
  DeepseekTestModel m = v3().model;
  const Fp8Checkpoint q = fp8_quantised(m.tensors);
  EXPECT_EQ(q.stored.at("model.layers.0.self_attn.kv_b_proj.weight").dtype(), DType::F8E4M3);
  EXPECT_EQ(q.stored.at("model.layers.0.mlp.gate_proj.weight").dtype(), DType::F8E4M3);
  EXPECT_EQ(q.stored.at("model.layers.1.mlp.gate.weight").dtype(), DType::F32);  // the router stays
  const fs::path dir = test::run_temp_dir("deepseek_fp8");
  write_sharded_checkpoint(dir, q.stored, 64 * 1024);
  std::ofstream(dir / "config.json") << fp8_config(m.config()).dump(2);
  m.tensors = q.dequantised;
  const ModelSpec spec = open_model_spec(dir);
  const auto prompts = prompts_of(m);
  expect_matches_reference(m, run_engine(spec, make_layout(2, 1, true, std::nullopt, 8), prompts), prompts);
  fs::remove_all(dir);
}

// Single-rank prefill logits of the V3 checkpoint's tensors under an edited config.json.
Tensor logits_with(const DeepseekTestModel& m, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = test::run_temp_dir("deepseek_keys");
  write_sharded_checkpoint(dir, m.tensors, 64 * 1024);
  nlohmann::json j = m.config();
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
  struct Remove {
    fs::path d;
    ~Remove() { fs::remove_all(d); }
  } remove{dir};
  const ModelSpec spec = open_model_spec(dir);
  return run_engine(spec, single(spec), {prompts_of(m)[0]}).prefill[0];
}

enum class Effect { Changes, Same, Refused };

// Every DeepSeek key is read (the logits change), inert (bit-identical logits) or refused naming the key.
TEST(Deepseek, EveryKeyIsReadOrInertOrRefusedByName) {
  const DeepseekTestModel& m = v3().model;
  const Tensor base = logits_with(m, [](nlohmann::json&) {});
  EXPECT_TRUE(close(base, m.dense_logits(prompts_of(m)[0])));
  struct Case {
    std::string key;
    nlohmann::json value;
    Effect effect;
  };
  const std::vector<Case> cases{
      {"routed_scaling_factor", 1.0, Effect::Changes},
      {"norm_topk_prob", false, Effect::Changes},
      {"n_group", 2, Effect::Changes},
      {"topk_group", 4, Effect::Changes},
      {"rope_interleave", false, Effect::Changes},
      {"num_experts_per_tok", 2, Effect::Changes},
      {"n_shared_experts", 0, Effect::Changes},
      {"first_k_dense_replace", 0, Effect::Refused},  // layer 0 has no experts in the checkpoint
      {"moe_layer_freq", 2, Effect::Refused},         // layer 1 has no dense MLP in the checkpoint
      {"aux_loss_alpha", 0.5, Effect::Same},
      {"seq_aux", false, Effect::Same},
      {"ep_size", 8, Effect::Same},
      {"num_nextn_predict_layers", 0, Effect::Same},
      {"attention_bias", true, Effect::Refused},
      {"mlp_bias", true, Effect::Refused},
      {"scoring_func", "softmax", Effect::Refused},
      {"topk_method", "greedy", Effect::Refused},
      {"num_key_value_heads", 2, Effect::Refused},
      {"head_dim", 6, Effect::Refused},
      {"hidden_act", "gelu", Effect::Refused},
      {"kv_lora_rank", 8, Effect::Refused},
      {"q_lora_rank", nullptr, Effect::Refused},  // no q_proj in the checkpoint
      {"some_new_key", 1, Effect::Refused},
  };
  for (const Case& c : cases) {
    try {
      const Tensor got = logits_with(m, [&](nlohmann::json& j) { j[c.key] = c.value; });
      EXPECT_NE(c.effect, Effect::Refused) << c.key << ": loaded, but should be refused";
      if (c.effect == Effect::Changes) {
        EXPECT_FALSE(close(got, base, 1e-4)) << c.key << ": logits unchanged";
      }
      if (c.effect == Effect::Same) {
        EXPECT_TRUE(
            std::equal(got.span<float>().begin(), got.span<float>().end(), base.span<float>().begin()))
            << c.key << ": logits changed";
      }
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(c.effect, Effect::Refused) << c.key << ": refused: " << msg;
      const bool names_key =
          msg.find("config.json") != std::string::npos && msg.find(c.key) != std::string::npos;
      const bool names_weights = msg.find("the config does not match the weights") != std::string::npos ||
                                 msg.find("has no tensor") != std::string::npos;
      EXPECT_TRUE(names_key || names_weights) << c.key << ": " << msg;
    }
  }
  // mscale_all_dim changes the softmax scale; mscale the rope's attention factor.
  EXPECT_FALSE(close(logits_with(m, [](nlohmann::json& j) { j["rope_scaling"]["mscale_all_dim"] = 1.0; }),
                     base, 1e-4));
  EXPECT_FALSE(
      close(logits_with(m, [](nlohmann::json& j) { j["rope_scaling"]["mscale"] = 0.8; }), base, 1e-4));
}

TEST(Deepseek, V4AndV5LayoutsGiveIdenticalLogits) {
  DeepseekTestModel m = v3().model;
  const Tensor v4 = logits_with(m, [](nlohmann::json&) {});
  m.v5 = true;
  const Tensor v5 = logits_with(m, [](nlohmann::json&) {});
  EXPECT_TRUE(std::equal(v4.span<float>().begin(), v4.span<float>().end(), v5.span<float>().begin()));
}

TEST(Deepseek, TheCacheHoldsTheLatentAndTheRopeKey) {
  const ModelSpec& s = v3().spec;
  const int64_t per_token = int64_t{3} * (16 + 4) * 4;  // layers x (kv_lora_rank + qk_rope_head_dim) x f32
  for (int tp : {1, 2, 4}) {
    const InferenceLayout layout = make_layout(tp, 1, true, std::nullopt, 8);
    for (int r = 0; r < tp; ++r) EXPECT_EQ(kv_bytes_per_token(s.config, s.features, layout, r), per_token);
  }
  auto store = open_store(s);
  const RankWeights w = load_rank_weights(*store, s, single(s), 0);
  const nn::LatentKvCache cache = nn::LatentKvCache::create(10, w.local_latent);
  EXPECT_EQ(cache.latent.numel(), 10 * (16 + 4));
}

}  // namespace
}  // namespace expar::infer
