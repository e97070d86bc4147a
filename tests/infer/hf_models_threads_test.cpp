// Qwen-MoE, Qwen3-MoE, OLMoE and gpt-oss end to end: small random checkpoints in the Hugging Face tensor
// names with a config.json (rope: Qwen default via v4 rope_theta, Qwen3 linear via v5 rope_parameters, OLMoE
// llama3 via v4 rope_scaling, gpt-oss the family's default YaRN).
//  - The single-rank engine (TP 1, no EP) matches an independent dense implementation in double (plain loops
//    over the Hugging Face tensors: q/k/v biases, shared expert with its sigmoid gate, softmax router with
//    and without norm_topk_prob; gpt-oss's o bias, sinks, sliding window, biased top-k-softmax router, fused
//    interleaved gate_up with biases and the clamped SwiGLU), so the reference itself is known right.
//    Qwen3-MoE: per-head q/k norms, q/k/v/o biases; OLMoE: q/k norms over the whole projection (sums of
//    squares completed over TP, a replicated key/value head counted once).
//  - Every layout of TP 1..4 x {no EP, full EP, variable EP} x DP {1, 2} gives that reference's prefill and
//    decode logits within 1e-5 relative and the same greedy tokens.
//  - --format / --path: detection, files as paths, and a format that contradicts the files.
#include <gtest/gtest.h>

#include <mutex>

#include "core/expect_error.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/generate.hpp"
#include "hf_test_models.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using expar::testing::expect_error;

constexpr int kReplicas = 2, kSeqsPerReplica = 2, kDecodeSteps = 4;

struct Reference {
  HfTestModel model;
  fs::path dir;
  ModelSpec spec;
  std::vector<std::vector<std::vector<int32_t>>> prompts;       // [replica][sequence]
  std::vector<std::vector<Tensor>> prefill_logits;              // [prompt len, V]
  std::vector<std::vector<std::vector<int32_t>>> greedy;        // kDecodeSteps + 1 tokens
  std::vector<std::vector<std::vector<Tensor>>> decode_logits;  // [1, V] after feeding greedy[i]
};

// The single-rank engine (TP 1, DP 1, no EP), one sequence at a time.
Reference build_reference(HfTestModel model, const std::string& name) {
  Reference r;
  r.model = std::move(model);
  r.dir = test::run_temp_dir(name);
  r.model.write(r.dir);
  r.spec = open_model_spec(r.dir);
  const int v = r.model.vocab;
  r.prompts = {{vocab_tokens(1, 7, v), vocab_tokens(2, 4, v)},
               {vocab_tokens(3, 5, v), vocab_tokens(4, 9, v)}};
  MemoryTracker& host = current_tracker();
  const InferenceLayout layout = make_layout(1, 1, false, std::nullopt, r.spec.config.moe.router.num_experts);
  run_ranks(1, [&](Comm& world) {
    auto store = open_store(r.spec);
    Engine engine(layout, world, load_rank_weights(*store, r.spec, layout, 0));
    for (int rep = 0; rep < kReplicas; ++rep) {
      r.prefill_logits.emplace_back();
      r.greedy.emplace_back();
      r.decode_logits.emplace_back();
      for (int s = 0; s < kSeqsPerReplica; ++s) {
        const int id = engine.add_sequence(r.spec.config.max_seq);
        Tensor logits = engine.prefill(std::vector<int>{id}, {r.prompts[rep][s]});
        r.prefill_logits[rep].push_back(export_to(host, logits));
        std::vector<int32_t> greedy{argmax_row(logits, logits.dim(0) - 1)};
        std::vector<Tensor> steps;
        for (int i = 0; i < kDecodeSteps; ++i) {
          logits = engine.decode(std::vector<int>{id}, std::vector<int32_t>{greedy.back()});
          steps.push_back(export_to(host, logits));
          greedy.push_back(argmax_row(logits, 0));
        }
        r.greedy[rep].push_back(greedy);
        r.decode_logits[rep].push_back(steps);
        engine.remove_sequence(id);
      }
    }
  });
  return r;
}

const Reference& reference(ModelFormat f) {
  switch (f) {
    case ModelFormat::QwenMoe: {
      static const Reference qwen = build_reference(qwen_test_model(), "qwen_e2e");
      return qwen;
    }
    case ModelFormat::Qwen3Moe: {
      static const Reference qwen3 = build_reference(qwen3_moe_test_model(), "qwen3_e2e");
      return qwen3;
    }
    case ModelFormat::Mixtral: {
      static const Reference mixtral = build_reference(mixtral_test_model(), "mixtral_e2e");
      return mixtral;
    }
    case ModelFormat::Olmoe: {
      static const Reference olmoe = build_reference(olmoe_test_model(), "olmoe_e2e");
      return olmoe;
    }
    default: {
      static const Reference gpt = build_reference(gpt_oss_test_model(), "gptoss_e2e");
      return gpt;
    }
  }
}

Tensor last_row(const Tensor& t) {
  return t.rows(t.dim(0) - 1, t.dim(0)).clone();
}

// The reference engine against the dense double implementation: prefill logits, and each decode step's
// logits against the dense model run over the whole prefix.
void expect_matches_dense(const Reference& r) {
  for (int rep = 0; rep < kReplicas; ++rep)
    for (int s = 0; s < kSeqsPerReplica; ++s) {
      std::vector<int32_t> seq = r.prompts[rep][s];
      EXPECT_TRUE(close(r.prefill_logits[rep][s], r.model.dense_logits(seq), 1e-4))
          << "prefill, replica " << rep << " sequence " << s;
      for (int i = 0; i < kDecodeSteps; ++i) {
        seq.push_back(r.greedy[rep][s][static_cast<size_t>(i)]);
        Tensor dense = r.model.dense_logits(seq);
        EXPECT_TRUE(close(r.decode_logits[rep][s][static_cast<size_t>(i)], last_row(dense), 1e-4))
            << "decode step " << i << ", replica " << rep << " sequence " << s;
        EXPECT_EQ(argmax_row(dense, dense.dim(0) - 1), r.greedy[rep][s][static_cast<size_t>(i) + 1]);
      }
    }
}

TEST(HfModels, QwenMoeSingleRankEngineMatchesADenseDoubleImplementation) {
  const Reference& r = reference(ModelFormat::QwenMoe);
  EXPECT_EQ(r.spec.format, ModelFormat::QwenMoe);
  EXPECT_FALSE(r.spec.config.moe.router.renormalize);  // norm_topk_prob false
  EXPECT_TRUE(r.spec.features.qkv_bias && r.spec.features.shared_expert_gate);
  EXPECT_EQ(r.spec.config.shared_expert_hidden, 18);
  expect_matches_dense(r);
}

TEST(HfModels, QwenMoeWithNormTopkProbMatchesTheDenseImplementation) {
  HfTestModel m = qwen_test_model(true);
  m.layers = 1;
  const fs::path dir = test::run_temp_dir("qwen_norm");
  m.write(dir);
  const ModelSpec spec = open_model_spec(dir);
  EXPECT_TRUE(spec.config.moe.router.renormalize);
  const std::vector<int32_t> prompt = vocab_tokens(5, 8, m.vocab);
  const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, spec.config.moe.router.num_experts);
  run_ranks(2, [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
    const int id = engine.add_sequence(16);
    EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), m.dense_logits(prompt), 1e-4));
  });
  fs::remove_all(dir);
}

// Qwen-MoE's dense MLP layers (Qwen2MoeDecoderLayer: mlp_only_layers, and decoder_sparse_step's layers
// (l + 1) % step != 0) run a Qwen2MoeMLP of intermediate_size, TP-sharded, in place of the MoE block.
TEST(HfModels, QwenMoeDenseLayersMatchTheDenseImplementation) {
  for (int variant = 0; variant < 2; ++variant) {
    HfTestModel m = variant == 0 ? qwen_test_model() : qwen3_moe_test_model();
    m.layers = 3;
    if (variant == 0)
      m.mlp_only_layers = {2};
    else
      m.sparse_step = 2;  // layers 0 and 2 dense
    m.tensors.clear();
    m.randomize(83);
    const fs::path dir = test::run_temp_dir("qwen_dense");
    m.write(dir);
    const ModelSpec spec = open_model_spec(dir);
    const std::vector<uint8_t> want =
        variant == 0 ? std::vector<uint8_t>{0, 0, 1} : std::vector<uint8_t>{1, 0, 1};
    EXPECT_EQ(spec.features.dense_mlp, want);
    EXPECT_EQ(spec.features.dense_mlp_hidden, 20);
    const std::vector<int32_t> prompt = vocab_tokens(5, 8, m.vocab);
    const Tensor dense = m.dense_logits(prompt);
    for (int tp : {1, 2, 4}) {
      const InferenceLayout layout =
          make_layout(tp, 1, tp > 1, std::nullopt, spec.config.moe.router.num_experts);
      run_ranks(tp, [&](Comm& world) {
        auto store = open_store(spec);
        Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
        const int id = engine.add_sequence(16);
        EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), dense, 1e-4)) << "TP " << tp;
        // A decode step through the dense layers' all-reduce.
        std::vector<int32_t> longer = prompt;
        longer.push_back(3);
        const Tensor step = engine.decode(std::vector<int>{id}, std::vector<int32_t>{3});
        const Tensor want_step = m.dense_logits(longer);
        EXPECT_TRUE(close(step, want_step.rows(want_step.dim(0) - 1, want_step.dim(0)).clone(), 1e-4));
      });
    }
    fs::remove_all(dir);
  }
}

// Qwen-MoE's sliding windows (use_sliding_window): Qwen2MoeConfig's layer_types, sliding on the even layers
// below max_window_layers; the window matters on a prompt longer than it.
TEST(HfModels, QwenMoeSlidingWindowsMatchTheDenseImplementation) {
  HfTestModel m = qwen_test_model();
  m.qwen_sliding = true;
  const fs::path dir = test::run_temp_dir("qwen_sliding");
  m.write(dir);
  const ModelSpec spec = open_model_spec(dir);
  EXPECT_EQ(spec.features.window, (std::vector<int64_t>{3, 0}));
  const std::vector<int32_t> prompt = vocab_tokens(6, 9, m.vocab);
  const Tensor dense = m.dense_logits(prompt);
  HfTestModel full = m;
  full.qwen_sliding = false;
  EXPECT_FALSE(close(full.dense_logits(prompt), dense, 1e-3));
  for (int tp : {1, 2}) {
    const InferenceLayout layout =
        make_layout(tp, 1, false, std::nullopt, spec.config.moe.router.num_experts);
    run_ranks(tp, [&](Comm& world) {
      auto store = open_store(spec);
      Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
      const int id = engine.add_sequence(16);
      EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), dense, 1e-4)) << "TP " << tp;
    });
  }
  fs::remove_all(dir);
}

TEST(HfModels, GptOssSingleRankEngineMatchesADenseDoubleImplementation) {
  const Reference& r = reference(ModelFormat::GptOss);
  EXPECT_EQ(r.spec.format, ModelFormat::GptOss);
  const ModelFeatures& f = r.spec.features;
  EXPECT_TRUE(f.qkv_bias && f.o_bias && f.attention_sinks && f.fused_experts);
  EXPECT_EQ(f.window, (std::vector<int64_t>{3, 0}));
  expect_matches_dense(r);
  // The features matter on these prompts: without the window (or the sinks) the dense model differs.
  HfTestModel full = r.model;
  full.window = 1000;
  EXPECT_FALSE(close(full.dense_logits(r.prompts[1][1]), r.prefill_logits[1][1], 1e-3));
  HfTestModel no_sinks = r.model;
  for (int l = 0; l < no_sinks.layers; ++l) {
    Tensor& sinks = no_sinks.tensors[no_sinks.layer(l) + "self_attn.sinks"];
    sinks = sinks.clone();
    for (float& v : sinks.span<float>()) v = -1e4f;
  }
  EXPECT_FALSE(close(no_sinks.dense_logits(r.prompts[1][1]), r.prefill_logits[1][1], 1e-3));
}

TEST(HfModels, GptOssTakesTheFamilyDefaultYarnRope) {
  const Reference& r = reference(ModelFormat::GptOss);
  const nn::RopeScaling& rope = r.spec.features.rope;
  EXPECT_EQ(rope.type, nn::RopeType::Yarn);
  EXPECT_EQ(rope.factor, 32.0);
  EXPECT_EQ(rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(rope.truncate);
  EXPECT_EQ(r.spec.config.rope_theta, 150000.0);
  // The YaRN rope matters on these prompts: the dense model with plain RoPE differs.
  HfTestModel plain = r.model;
  plain.rope = nn::RopeScaling{};
  EXPECT_FALSE(close(plain.dense_logits(r.prompts[1][1]), r.prefill_logits[1][1], 1e-3));
}

TEST(HfModels, MixtralWithASlidingWindowMatchesADenseDoubleImplementation) {
  const Reference& r = reference(ModelFormat::Mixtral);
  EXPECT_EQ(r.spec.features.window, (std::vector<int64_t>{3, 3}));
  EXPECT_TRUE(r.spec.config.moe.router.renormalize);
  expect_matches_dense(r);
  HfTestModel full = r.model;  // the window matters on these prompts
  full.mixtral_window = 0;
  EXPECT_FALSE(close(full.dense_logits(r.prompts[1][1]), r.prefill_logits[1][1], 1e-3));
}

TEST(HfModels, Qwen3MoeSingleRankEngineMatchesADenseDoubleImplementation) {
  const Reference& r = reference(ModelFormat::Qwen3Moe);
  EXPECT_EQ(r.spec.format, ModelFormat::Qwen3Moe);
  EXPECT_EQ(r.spec.features.qk_norm, QkNorm::PerHead);
  EXPECT_TRUE(r.spec.features.qkv_bias && r.spec.features.o_bias);
  EXPECT_TRUE(r.spec.config.moe.router.renormalize);
  EXPECT_EQ(r.spec.features.rope.type, nn::RopeType::Linear);
  EXPECT_EQ(r.spec.config.head_dim, 8);
  expect_matches_dense(r);
  // The per-head norms matter: unit gains give other logits.
  HfTestModel unit = r.model;
  for (int l = 0; l < unit.layers; ++l) {
    Tensor& g = unit.tensors[unit.layer(l) + "self_attn.q_norm.weight"];
    g = g.clone();
    for (float& v : g.span<float>()) v = 1.0f;
  }
  EXPECT_FALSE(close(unit.dense_logits(r.prompts[0][0]), r.prefill_logits[0][0], 1e-3));
}

TEST(HfModels, OlmoeSingleRankEngineMatchesADenseDoubleImplementation) {
  const Reference& r = reference(ModelFormat::Olmoe);
  EXPECT_EQ(r.spec.format, ModelFormat::Olmoe);
  EXPECT_EQ(r.spec.features.qk_norm, QkNorm::Projection);
  EXPECT_FALSE(r.spec.features.qkv_bias || r.spec.features.o_bias);
  EXPECT_FALSE(r.spec.config.moe.router.renormalize);
  EXPECT_EQ(r.spec.features.rope.type, nn::RopeType::Llama3);
  expect_matches_dense(r);
  // The norm spans the whole projection: per-head norms (Qwen3's) give other logits.
  HfTestModel per_head = r.model;
  per_head.format = ModelFormat::Qwen3Moe;
  for (int l = 0; l < per_head.layers; ++l)
    for (const char* n : {"q_norm", "k_norm"}) {
      Tensor& g = per_head.tensors[per_head.layer(l) + "self_attn." + n + ".weight"];
      g = g.rows(0, per_head.head_dim).clone();
    }
  EXPECT_FALSE(close(per_head.dense_logits(r.prompts[0][0]), r.prefill_logits[0][0], 1e-3));
}

// Some gpt-oss expert activations pass the clamp, so the comparisons above cover it.
TEST(HfModels, GptOssTestModelReachesTheSwigluClamp) {
  const Reference& r = reference(ModelFormat::GptOss);
  r.model.clamp_hits = 0;
  r.model.dense_logits(r.prompts[0][0]);
  EXPECT_GT(r.model.clamp_hits, 0);
}

struct Case {
  ModelFormat format;
  int tp, dp;
  bool ep;
  std::optional<int> ep_degree;
  PlacementKind placement = PlacementKind::Contiguous;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string mode = !c.ep ? "noEP" : c.ep_degree ? "EP" + std::to_string(*c.ep_degree) : "fullEP";
  const char* family = c.format == ModelFormat::Mixtral    ? "mixtral"
                       : c.format == ModelFormat::QwenMoe  ? "qwen"
                       : c.format == ModelFormat::Qwen3Moe ? "qwen3"
                       : c.format == ModelFormat::Olmoe    ? "olmoe"
                                                           : "gptoss";
  return std::string(family) + "_TP" + std::to_string(c.tp) + "_DP" + std::to_string(c.dp) + "_" + mode +
         (c.placement == PlacementKind::RoundRobin ? "_rr" : "");
}

class HfLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(HfLayouts, PrefillAndDecodeMatchTheSingleRankReference) {
  const Case& c = GetParam();
  const Reference& ref = reference(c.format);
  const InferenceLayout layout =
      make_layout(c.tp, c.dp, c.ep, c.ep_degree, ref.spec.config.moe.router.num_experts, c.placement);
  run_ranks(layout.world(), [&](Comm& world) {
    auto store = open_store(ref.spec);
    Engine engine(layout, world, load_rank_weights(*store, ref.spec, layout, world.rank()));
    const int rep = engine.dp_rank();
    std::vector<int> ids;
    for (int s = 0; s < kSeqsPerReplica; ++s) ids.push_back(engine.add_sequence(ref.spec.config.max_seq));
    Tensor logits = engine.prefill(ids, ref.prompts[rep]);
    int64_t row = 0;
    for (int s = 0; s < kSeqsPerReplica; ++s) {
      const Tensor& want = ref.prefill_logits[rep][s];
      EXPECT_TRUE(close(logits.rows(row, row + want.dim(0)), want))
          << "prefill, rank " << world.rank() << " sequence " << s;
      row += want.dim(0);
      EXPECT_EQ(argmax_row(logits, row - 1), ref.greedy[rep][s][0]);
    }
    for (int i = 0; i < kDecodeSteps; ++i) {
      std::vector<int32_t> next;
      for (int s = 0; s < kSeqsPerReplica; ++s) next.push_back(ref.greedy[rep][s][static_cast<size_t>(i)]);
      Tensor out = engine.decode(ids, next);
      ASSERT_EQ(out.dim(0), kSeqsPerReplica);
      for (int s = 0; s < kSeqsPerReplica; ++s) {
        EXPECT_TRUE(close(out.rows(s, s + 1), ref.decode_logits[rep][s][static_cast<size_t>(i)]))
            << "decode step " << i << ", rank " << world.rank() << " sequence " << s;
        EXPECT_EQ(argmax_row(out, s), ref.greedy[rep][s][static_cast<size_t>(i) + 1])
            << "greedy token, decode step " << i;
      }
    }
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (ModelFormat f : {ModelFormat::QwenMoe, ModelFormat::GptOss, ModelFormat::Qwen3Moe, ModelFormat::Olmoe,
                        ModelFormat::Mixtral}) {
    for (int dp = 1; dp <= 2; ++dp)
      for (int tp = 1; tp <= 4; ++tp) {
        v.push_back({f, tp, dp, false, std::nullopt});
        v.push_back({f, tp, dp, true, std::nullopt});  // full EP: ep_degree = TP * DP
      }
    v.push_back({f, 4, 1, true, 2});  // variable EP: experts on EP_TP pairs, intermediate halves
    v.push_back({f, 2, 1, true, 1});  // EP with one partition: experts TP-sharded
    v.push_back({f, 4, 1, true, 2, PlacementKind::RoundRobin});
    v.push_back({f, 2, 2, true, std::nullopt, PlacementKind::RoundRobin});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Infer, HfLayouts, ::testing::ValuesIn(all_cases()), case_name);

// generate() with DP 2 (replica 1 idle, DP padding) through each kind of path.
TEST(HfModels, GenerateThroughPathsAndFormats) {
  for (ModelFormat f : {ModelFormat::QwenMoe, ModelFormat::GptOss}) {
    const Reference& ref = reference(f);
    GenerateOptions o;
    o.tp = 2;
    o.dp = 2;
    o.enable_expert_parallel = true;
    const std::vector<int32_t>& prompt = ref.prompts[0][1];
    const std::vector<int32_t> want = ref.greedy[0][1];
    // Detected from the directory, from config.json, and from the index file; and named explicitly.
    for (const fs::path& p : {ref.dir, ref.dir / "config.json", ref.dir / "model.safetensors.index.json"}) {
      GenerateResult r = generate(o, p.string(), prompt, kDecodeSteps + 1);
      EXPECT_EQ(r.format, f) << p;
      EXPECT_EQ(r.tokens, want) << p;
      EXPECT_GT(r.prefill_tokens_per_s, 0.0);
      EXPECT_GT(r.decode_tokens_per_s, 0.0);
    }
    o.format = f;
    EXPECT_EQ(generate(o, ref.dir.string(), prompt, kDecodeSteps + 1).tokens, want);
  }
}

TEST(HfModels, OneSafetensorsFileAsThePath) {
  const Reference& ref = reference(ModelFormat::QwenMoe);
  const fs::path dir = test::run_temp_dir("qwen_single");
  write_safetensors(dir / "weights.safetensors", ref.model.tensors);
  std::ofstream(dir / "config.json") << ref.model.config().dump(2);
  GenerateOptions o;
  o.tp = 2;
  o.enable_expert_parallel = true;
  EXPECT_EQ(generate(o, (dir / "weights.safetensors").string(), ref.prompts[0][0], kDecodeSteps + 1).tokens,
            ref.greedy[0][0]);
  fs::remove_all(dir);
}

TEST(HfModels, AFormatThatContradictsTheFilesIsRefusedNamingBoth) {
  const Reference& qwen = reference(ModelFormat::QwenMoe);
  expect_error([&] { open_model_spec(qwen.dir, ModelFormat::Mixtral); },
               {"mixtral", "qwen2_moe", "qwen-moe"});
  expect_error([&] { open_model_spec(qwen.dir, ModelFormat::GptOss); }, {"gpt-oss", "qwen2_moe"});
  expect_error([&] { open_model_spec(qwen.dir, ModelFormat::Expar); },
               {"ours", "manifest.json", "qwen2_moe"});
  expect_error([] { model_format_from_name("llama"); }, {"llama", "qwen-moe", "gpt-oss"});
  expect_error([&] { open_model_spec(qwen.dir / "missing"); }, {"does not exist"});
  // An expar checkpoint given a Hugging Face format.
  const fs::path ours = test::run_temp_dir("ours_fmt");
  std::ofstream(ours / "manifest.json") << "{}";
  expect_error([&] { open_model_spec(ours, ModelFormat::QwenMoe); }, {"qwen-moe", "manifest.json"});
  fs::remove_all(ours);
  // Settings the engine does not run are refused by name.
  HfTestModel m = qwen_test_model();
  const fs::path dir = test::run_temp_dir("qwen_bad");
  m.write(dir);
  auto rewrite = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = m.config();
    j[key] = value;
    std::ofstream(dir / "config.json") << j.dump(2);
  };
  rewrite("mlp_only_layers", {7});
  expect_error([&] { open_model_spec(dir); }, {"mlp_only_layers", "[0, 2)"});
  rewrite("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}});
  expect_error([&] { open_model_spec(dir); }, {"rope_scaling", "dynamic", "yarn"});
  rewrite("layer_types", {"sliding_attention", "full_attention"});  // without use_sliding_window
  expect_error([&] { open_model_spec(dir); }, {"layer_types", "use_sliding_window"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace expar::infer
