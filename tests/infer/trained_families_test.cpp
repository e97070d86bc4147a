// Training the Hugging Face families (expar train --model): the training model's forward against the
// independent dense double reference of hf_test_models.hpp for Qwen-MoE (q/k/v biases, gated shared
// expert), Qwen3-MoE (per-head q/k norms, q/k/v/o biases, linear rope; also with tied embeddings), OLMoE
// (projection q/k norms, llama3 rope), Mixtral (sliding window) and gpt-oss (sinks, sliding/full layers,
// YaRN, router bias with softmax over the top k, biased clamped-SwiGLU experts); every parameter's gradient,
// the families' new kinds included, against finite differences; training runs whose saves are Hugging Face
// checkpoints of the family that the inference engine reads under another layout, that resume bit for bit,
// and that --format ours refuses naming the family; and gpt-oss's MXFP4 experts dequantised when a
// fine-tuning run loads them. DeepSeek-V3 and V2 (multi-head latent attention, a dense first layer, V3's
// grouped sigmoid router with its correction bias as the score bias, ungated shared experts) and Qwen-MoE
// with a dense layer take the same checks; DeepSeek-V3 also trains to equal losses under two EP layouts.
//
// Links expar_train as well as expar_infer (tests/CMakeLists.txt): it is the one place both meet.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <tuple>

#include "deepseek_test_model.hpp"
#include "expar/infer/evaluate.hpp"
#include "expar/model/hf_config.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/checkpoint.hpp"
#include "expar/train/run_model.hpp"
#include "expar/train/trainer.hpp"
#include "hf_test_models.hpp"
#include "infer_test_util.hpp"

namespace expar::infer::testing {
namespace {

// Qwen-MoE with its first layer dense (mlp_only_layers [0]): a Qwen2MoeMLP in place of the MoE block, so
// the MoE layers start at block 1.
HfTestModel qwen_dense_test_model() {
  HfTestModel m = qwen_test_model();
  m.layers = 3;
  m.mlp_only_layers = {0};
  m.tensors.clear();
  m.randomize(83);
  return m;
}

struct Family {
  const char* name;
  HfTestModel (*make)();
  // Parameters of the kinds only the families have (family_kind): Qwen-MoE q bias + shared-expert gate per
  // layer; Qwen3-MoE q and o biases + q and k norms; OLMoE q and k norms; Mixtral none (its window is not a
  // parameter: its gradients run through the windowed softmax); gpt-oss q and o biases, sinks, router bias
  // and the experts' gate, up and down biases; all over 2 layers. Qwen-MoE with a dense layer: 3 q biases,
  // 2 gates and the dense MLP's w1, w3 and w2.
  int family_kinds;
};

const Family kFamilies[] = {
    {"qwen_moe", [] { return qwen_test_model(); }, 2 * 2},
    {"qwen3_moe", [] { return qwen3_moe_test_model(); }, 4 * 2},
    {"qwen3_moe_tied", [] { return tied_qwen3_moe_test_model(); }, 4 * 2},
    {"olmoe", [] { return olmoe_test_model(); }, 2 * 2},
    {"mixtral", [] { return mixtral_test_model(); }, 0},
    {"gpt_oss", [] { return gpt_oss_test_model(); }, 7 * 2},
    {"qwen_moe_dense", qwen_dense_test_model, 3 + 2 + 3},
};

bool family_kind(const std::string& n) {
  for (const char* suffix : {".bq", ".bo", "q_norm", "k_norm", ".shared.gate", ".sinks", ".router_bias",
                             ".experts.b1", ".experts.b3", ".experts.b2", ".mlp.w1", ".mlp.w3", ".mlp.w2"})
    if (n.ends_with(suffix)) return true;
  return false;
}

// The kinds DeepSeek adds: latent attention's (wq for V2's plain q projection) and the dense layer's MLP.
bool deepseek_kind(const std::string& n) {
  for (const char* suffix : {".attn.wq", ".attn.wq_a", ".attn.q_a_norm", ".attn.wq_b", ".attn.wkv_a",
                             ".attn.kv_a_norm", ".attn.wkv_b", ".mlp.w1", ".mlp.w3", ".mlp.w2"})
    if (n.ends_with(suffix)) return true;
  return false;
}

ModelFormat format_of(const HfTestModel& m) {
  return m.format;
}
ModelFormat format_of(const DeepseekTestModel& m) {
  return m.v3 ? ModelFormat::DeepseekV3 : ModelFormat::DeepseekV2;
}
bool tied_of(const HfTestModel& m) {
  return m.tied;
}
bool tied_of(const DeepseekTestModel&) {
  return false;
}

// Every parameter's gradient from one forward_backward against central differences of model.evaluate's
// loss. Among the 2 * elements + 4 elements with the largest gradients (where a finite difference is most
// informative), the first `elements` where the loss is smooth (central differences at eps and eps/2 agree
// within 10%; where they do not, a perturbation flips a token's top-k choice and the loss jumps, which no
// gradient describes) must match: |g - fd| <= 3e-2 |fd| + 5e-4, eps = 4e-4 max(1, |w|). `elements` is that
// count for the parameters `thorough` names and 1 for the others. Returns how many parameters `counted`
// names were checked.
int check_every_gradient(MoeTransformer& model, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& targets, int64_t batch, int64_t seq,
                         const std::function<bool(const std::string&)>& counted,
                         const std::function<bool(const std::string&)>& thorough = {}, int elements = 1) {
  model.zero_grads();
  model.forward_backward(tokens, targets, batch, seq, batch * seq);
  int kinds = 0;
  auto loss_at = [&](float* w, float value) {
    const float saved = *w;
    *w = value;
    const double loss = model.evaluate(tokens, targets, batch, seq).loss;
    *w = saved;
    return loss;
  };
  for (Parameter& p : model.parameters()) {
    const int want = thorough && thorough(p.name) ? elements : 1;
    const float* g = p.grad.data<float>();
    std::vector<int64_t> order(static_cast<size_t>(p.grad.numel()));
    std::iota(order.begin(), order.end(), 0);
    const size_t candidates = std::min<size_t>(static_cast<size_t>(2 * want + 4), order.size());
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(candidates), order.end(),
                      [g](int64_t x, int64_t y) { return std::fabs(g[x]) > std::fabs(g[y]); });
    float* w = p.value.data<float>();
    int checked = 0;
    for (size_t c = 0; c < candidates && checked < want; ++c) {
      const int64_t i = order[c];
      const float eps = 4e-4f * std::max(1.0f, std::fabs(w[i]));
      const double wide = (loss_at(w + i, w[i] + eps) - loss_at(w + i, w[i] - eps)) / (2.0 * eps);
      const double narrow =
          (loss_at(w + i, w[i] + eps / 2) - loss_at(w + i, w[i] - eps / 2)) / static_cast<double>(eps);
      if (std::fabs(wide - narrow) > 0.1 * std::fabs(wide) + 1e-4) continue;
      EXPECT_NEAR(g[i], wide, 3e-2 * std::fabs(wide) + 5e-4) << p.name << " element " << i;
      EXPECT_GT(std::fabs(g[i]), 0.0f) << p.name << " has an all-zero gradient";
      ++checked;
    }
    EXPECT_EQ(checked, std::min<int>(want, static_cast<int>(candidates)))
        << p.name << ": the loss jumps near its " << candidates << " largest-gradient elements";
    kinds += counted(p.name);
  }
  return kinds;
}

class TrainedFamilies : public ::testing::TestWithParam<Family> {};

// The architecture config.json describes, on one rank (path local), without auxiliary losses (evaluate()
// reports cross-entropy only).
template <class M>
Architecture training_architecture(const M& m) {
  Architecture a = hf_architecture(m.config(), "test config.json");
  a.config.moe.router.aux_loss_coef = 0.0;
  a.config.moe.router.z_loss_coef = 0.0;
  return a;
}

// The training model (one rank) loaded from the test model's weights: the logits of two sequences of 9 tokens
// in one batch are the dense double reference's within `rtol` of the largest.
template <class M>
void expect_forward_matches_reference(const M& m, const std::string& name, double rtol) {
  const fs::path dir = test::run_temp_dir("train_fwd_" + name);
  m.write(dir);
  const Architecture a = training_architecture(m);
  const std::vector<int32_t> first = vocab_tokens(11, 9, m.vocab), second = vocab_tokens(12, 9, m.vocab);
  std::vector<int32_t> both = first;
  both.insert(both.end(), second.begin(), second.end());
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(a.config, {}, *group, 0, a.features);
    model.init(3);
    load_hf_weights(dir, a.format, model);
    const Tensor logits = model.logits(both, 2, 9);  // two sequences of 9 tokens
    EXPECT_TRUE(close(logits.rows(0, 9).clone(), m.dense_logits(first), rtol)) << "sequence 0";
    EXPECT_TRUE(close(logits.rows(9, 18).clone(), m.dense_logits(second), rtol)) << "sequence 1";
  });
  fs::remove_all(dir);
}

TEST_P(TrainedFamilies, TrainingForwardMatchesTheDenseDoubleReference) {
  const HfTestModel m = GetParam().make();
  expect_forward_matches_reference(m, GetParam().name, 1e-4);
  if (m.format == ModelFormat::GptOss) {
    EXPECT_GT(m.clamp_hits, 0) << "no activation reached the clamped SwiGLU's limits";
  }
}

TEST_P(TrainedFamilies, EveryParameterGradientMatchesFiniteDifferences) {
  const HfTestModel m = GetParam().make();
  const fs::path dir = test::run_temp_dir(std::string("train_fd_") + GetParam().name);
  m.write(dir);
  const Architecture a = training_architecture(m);
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(a.config, {}, *group, 0, a.features);
    model.init(5);
    load_hf_weights(dir, a.format, model);
    const int64_t batch = 2, seq = 6;
    const auto tokens = vocab_tokens(21, static_cast<int>(batch * seq), m.vocab);
    const auto targets = vocab_tokens(22, static_cast<int>(batch * seq), m.vocab);
    // Each family's own kinds were among the parameters checked.
    EXPECT_EQ(check_every_gradient(model, tokens, targets, batch, seq, family_kind), GetParam().family_kinds);
    // Tied embeddings: one parameter, no LM head of its own (its gradient is the embedding's, checked).
    for (const Parameter& p : model.parameters())
      EXPECT_FALSE(m.tied && p.name == "lm_head") << "a tied model has its own LM head parameter";
  });
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Infer, TrainedFamilies, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& i) { return std::string(i.param.name); });

TokenCorpus family_corpus(int vocab) {
  return TokenCorpus::from_tokens(vocab_tokens(99, 3000, vocab), vocab);
}

template <class M>
TrainConfig family_run(const M& m, const fs::path& weights, const fs::path& checkpoint) {
  const Architecture a = hf_architecture(m.config(), "test config.json");
  TrainConfig c;
  c.model = a.config;
  c.format = a.format;
  c.features = a.features;
  c.hf_config_json = m.config().dump(2);
  c.init_from = weights.string();
  c.ep = 2;
  c.execution.moe.path = "rowwise";
  c.steps = 3;
  c.global_batch = 4;
  c.seq_len = 8;
  c.warmup = 1;
  c.eval_every = 0;
  c.eval_sequences = 2;
  c.checkpoint_dir = checkpoint.string();
  c.checkpoint_every = 1;
  c.keep_last = 0;
  return c;
}

// The logits of `prompt` from the training model (one rank) loaded from the save `run`, after checking that
// the engine on TP 2 with EP loaded from the same save gives them within 1e-5, and `expar eval`'s loss on
// two other layouts is theirs.
template <class M>
Tensor logits_of_save(const fs::path& run, const M& m, const std::vector<int32_t>& prompt) {
  const auto n = static_cast<int64_t>(prompt.size());
  Tensor trained;
  MemoryTracker& host = current_tracker();  // this thread's: the rank's tracker ends with run_ranks
  run_ranks(1, [&](Comm& world) {
    Architecture a = hf_architecture(m.config(), "test config.json");
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(a.config, {}, *group, 0, a.features);
    load_checkpoint(run.string(), model, nullptr);
    trained = export_to(host, model.logits(prompt, 1, n));
  });
  const ModelSpec spec = open_model_spec(run);
  const InferenceLayout layout = make_layout(2, 1, true, std::nullopt, spec.config.moe.router.num_experts);
  run_ranks(2, [&](Comm& world) {
    auto store = open_store(spec);
    Engine engine(layout, world, load_rank_weights(*store, spec, layout, world.rank()));
    const int id = engine.add_sequence(16);
    EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), trained, 1e-5))
        << "rank " << world.rank();
  });
  // `expar eval` from the save, on TP 2 with EP and on DP 2 without it: the mean next-token loss of the
  // prompt (one window) is the training model's.
  double want = 0.0;
  for (int64_t i = 0; i + 1 < n; ++i)
    want += token_loss(trained.data<float>() + i * trained.dim(1), trained.dim(1),
                       prompt[static_cast<size_t>(i + 1)]);
  want /= static_cast<double>(n - 1);
  for (const auto& [tp, dp, ep] : {std::tuple{2, 1, true}, std::tuple{1, 2, false}}) {
    EvaluateOptions o;
    o.engine.tp = tp;
    o.engine.dp = dp;
    o.engine.enable_expert_parallel = ep;
    o.window = n - 1;
    const EvaluateResult r = evaluate(o, run.string(), prompt);
    EXPECT_EQ(r.predicted, n - 1);
    EXPECT_NEAR(r.mean_loss, want, 1e-5 * want) << "eval on TP " << tp << " DP " << dp;
  }
  return trained;
}

struct SaveCase {
  const char* name;
  HfTestModel (*make)();
  std::vector<std::string> present, absent;  // tensor names the save's index must / must not hold
};

const SaveCase kSaveCases[] = {
    // Biases and the gated shared expert make the most tensor kinds.
    {"qwen_moe",
     [] { return qwen_test_model(); },
     {"model.layers.1.mlp.shared_expert_gate.weight", "model.layers.0.self_attn.q_proj.bias",
      "model.layers.1.mlp.experts.23.down_proj.weight", "lm_head.weight"},
     {}},
    // The stacked experts, gathered from both EP ranks into one tensor per name.
    {"gpt_oss",
     [] { return gpt_oss_test_model(); },
     {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias",
      "model.layers.1.mlp.experts.down_proj", "model.layers.0.mlp.experts.down_proj_bias",
      "model.layers.0.mlp.router.bias", "model.layers.1.self_attn.sinks"},
     {"model.layers.0.mlp.experts.0.gate_proj.weight"}},
    {"qwen3_moe_tied",
     [] { return tied_qwen3_moe_test_model(); },
     {"model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight"},
     {"lm_head.weight"}},
    // A dense first layer: its MLP under the family's dense names, no router or experts there.
    {"qwen_moe_dense",
     qwen_dense_test_model,
     {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
      "model.layers.1.mlp.experts.23.up_proj.weight", "model.layers.2.mlp.shared_expert_gate.weight"},
     {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.gate_proj.weight"}},
};

class TrainedFamilySaves : public ::testing::TestWithParam<SaveCase> {};

// Trained on 2 ranks with EP 2, each save is a Hugging Face checkpoint of the family (config.json, index,
// the family's names) that the engine loads on TP 2 with EP and that a single-rank training model loads
// back, with the same logits (and that --format ours refuses, naming the family and its flag); a run resumed
// from step 2 ends with the same weights as the uninterrupted run.
template <class M>
void expect_saves_are_checkpoints_of_the_family(const M& m, const std::string& tag,
                                                const std::vector<std::string>& present,
                                                const std::vector<std::string>& absent,
                                                double score_bias_rate = 0.0) {
  const fs::path weights = test::run_temp_dir("train_hf_weights_" + tag),
                 straight = test::run_temp_dir("train_hf_straight_" + tag),
                 resumed = test::run_temp_dir("train_hf_resumed_" + tag);
  m.write(weights);
  const TokenCorpus corpus = family_corpus(m.vocab);
  TrainConfig run = family_run(m, weights, straight);
  run.score_bias_rate = score_bias_rate;
  run_ranks(2, [&](Comm& world) { train(run, world, corpus); });
  TrainConfig first_two = family_run(m, weights, resumed);
  first_two.score_bias_rate = score_bias_rate;
  first_two.stop_after = 2;
  run_ranks(2, [&](Comm& world) { train(first_two, world, corpus); });
  TrainConfig rest = family_run(m, weights, resumed);
  rest.score_bias_rate = score_bias_rate;
  rest.resume_from = resumed.string();
  run_ranks(2, [&](Comm& world) { train(rest, world, corpus); });

  // The save's layout: the family's names, an index covering exactly the weight shards, config.json.
  const ModelSpec spec = open_model_spec(straight);
  EXPECT_EQ(spec.format, format_of(m));
  EXPECT_EQ(spec.features.tied_embeddings, tied_of(m));
  const fs::path step = straight / "step-3";
  ShardedCheckpoint index = ShardedCheckpoint::open_directory(step);
  EXPECT_NO_THROW(index.validate());
  for (const std::string& name : present) EXPECT_TRUE(index.contains(name)) << name;
  for (const std::string& name : absent) EXPECT_FALSE(index.contains(name)) << name;
  EXPECT_EQ(index.names().size(), m.tensors.size());
  for (const auto& [name, t] : m.tensors)
    EXPECT_EQ(index.info(name).shape, t.shape()) << name << " is saved in another shape than the family's";
  EXPECT_TRUE(fs::exists(step / "optimizer-dense.safetensors"));
  // A score bias the run moves (DeepSeek-V3's e_score_correction_bias) is saved as moved.
  if (score_bias_rate > 0) {
    for (const std::string& name : index.names()) {
      if (name.ends_with("e_score_correction_bias")) {
        EXPECT_FALSE(close(index.read(name), m.tensors.at(name), 1e-6)) << name << " did not move";
      }
    }
  }

  // --format ours (our own tensor names and architecture) on the family's save is refused before anything
  // is loaded, naming the family, where the save says it, and the flag that reads it; so is `expar eval`.
  const std::string family = model_format_name(format_of(m));
  auto expect_refused = [&](const std::function<void()>& read, const std::string& how) {
    try {
      read();
      ADD_FAILURE() << how << ": --format ours on a " << family << " save must be refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const std::string& part : {std::string("--format ours"), "\"architecture\": \"" + family + "\"",
                                      "pass --format " + family + " or --format auto"})
        EXPECT_NE(what.find(part), std::string::npos) << how << ": " << what;
    }
  };
  expect_refused([&] { open_model_spec(straight, ModelFormat::Expar); }, "open_model_spec");
  expect_refused(
      [&] {
        EvaluateOptions o;
        o.engine.format = ModelFormat::Expar;
        evaluate(o, straight.string(), vocab_tokens(7, 10, m.vocab));
      },
      "evaluate");

  // Resumed == straight, tensor for tensor.
  ShardedCheckpoint other = ShardedCheckpoint::open_directory(resumed / "step-3");
  for (const std::string& name : index.names()) {
    const Tensor a = index.read(name), b = other.read(name);
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name << " differs after resume";
  }

  // Training changed the weights; the engine (TP 2, EP) and a training model loaded from the save agree.
  const std::vector<int32_t> prompt = vocab_tokens(7, 10, m.vocab);
  EXPECT_FALSE(close(logits_of_save(straight, m, prompt), m.dense_logits(prompt), 1e-3))
      << "three steps did not change the model";
  for (const fs::path& p : {weights, straight, resumed}) fs::remove_all(p);
}

TEST_P(TrainedFamilySaves, AreHuggingFaceCheckpointsTheEngineReadsAndResumeFrom) {
  expect_saves_are_checkpoints_of_the_family(GetParam().make(), GetParam().name, GetParam().present,
                                             GetParam().absent);
}

INSTANTIATE_TEST_SUITE_P(Infer, TrainedFamilySaves, ::testing::ValuesIn(kSaveCases),
                         [](const ::testing::TestParamInfo<SaveCase>& i) {
                           return std::string(i.param.name);
                         });

struct DeepseekCase {
  const char* name;
  DeepseekTestModel (*make)();
  // deepseek_kind parameters: latent attention's per layer (V3: wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm,
  // wkv_b; V2: wq, wkv_a, kv_a_norm, wkv_b) over 3 layers, and the dense first layer's w1, w3 and w2.
  int deepseek_kinds;
  std::vector<std::string> present;  // tensor names a save holds besides those both versions hold
};

const DeepseekCase kDeepseek[] = {
    {"v3",
     [] { return deepseek_v3_test_model(); },
     6 * 3 + 3,
     {"model.layers.1.self_attn.q_a_proj.weight", "model.layers.2.self_attn.q_a_layernorm.weight",
      "model.layers.1.self_attn.q_b_proj.weight", "model.layers.2.mlp.gate.e_score_correction_bias"}},
    {"v2", [] { return deepseek_v2_test_model(); }, 4 * 3 + 3, {"model.layers.0.self_attn.q_proj.weight"}},
};

class TrainedDeepseek : public ::testing::TestWithParam<DeepseekCase> {};

// Latent attention (q LoRA or a plain q projection, interleaved YaRN rope, the latent norms at 1e-6), the
// dense first layer, V3's grouped sigmoid router with its correction bias (loaded as the score bias) and V2's
// softmax router, both scaled by routed_scaling_factor, and the ungated shared experts: the training model's
// logits are the reference's within 1e-5 of the largest.
TEST_P(TrainedDeepseek, TrainingForwardMatchesTheDenseDoubleReference) {
  expect_forward_matches_reference(GetParam().make(), std::string("deepseek_") + GetParam().name, 1e-5);
}

// Every parameter against finite differences (check_every_gradient's tolerance), on 3 elements each of the
// kinds DeepSeek adds.
TEST_P(TrainedDeepseek, EveryParameterGradientMatchesFiniteDifferences) {
  const DeepseekTestModel m = GetParam().make();
  const fs::path dir = test::run_temp_dir(std::string("train_fd_deepseek_") + GetParam().name);
  m.write(dir);
  const Architecture a = training_architecture(m);
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(a.config, {}, *group, 0, a.features);
    model.init(5);
    load_hf_weights(dir, a.format, model);
    EXPECT_FALSE(model.has_moe(0)) << "layer 0 is dense";
    const int64_t batch = 2, seq = 6;
    const auto tokens = vocab_tokens(21, static_cast<int>(batch * seq), m.vocab);
    const auto targets = vocab_tokens(22, static_cast<int>(batch * seq), m.vocab);
    EXPECT_EQ(check_every_gradient(model, tokens, targets, batch, seq, deepseek_kind, deepseek_kind, 3),
              GetParam().deepseek_kinds);
  });
  fs::remove_all(dir);
}

// Trained on 2 ranks with EP 2 (V3 moving its score bias at --score-bias-rate 1e-3), the saves are DeepSeek
// checkpoints: the dense layer's MLP, the latent attention's tensors, per-expert names, the correction bias;
// the engine (TP 2 with EP) and evaluate read them, and a resumed run ends bit for bit where the straight
// one does.
TEST_P(TrainedDeepseek, SavesAreCheckpointsTheEngineReadsAndResumeFrom) {
  const DeepseekTestModel m = GetParam().make();
  std::vector<std::string> present{"model.layers.0.mlp.gate_proj.weight",
                                   "model.layers.0.mlp.down_proj.weight",
                                   "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                                   "model.layers.2.self_attn.kv_a_layernorm.weight",
                                   "model.layers.1.self_attn.kv_b_proj.weight",
                                   "model.layers.1.self_attn.o_proj.weight",
                                   "model.layers.2.mlp.experts.7.down_proj.weight",
                                   "model.layers.1.mlp.shared_experts.up_proj.weight"};
  present.insert(present.end(), GetParam().present.begin(), GetParam().present.end());
  expect_saves_are_checkpoints_of_the_family(
      m, std::string("deepseek_") + GetParam().name, present,
      {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.gate_proj.weight",
       "model.layers.0.mlp.shared_experts.gate_proj.weight"},
      m.v3 ? 1e-3 : 0.0);
}

INSTANTIATE_TEST_SUITE_P(Infer, TrainedDeepseek, ::testing::ValuesIn(kDeepseek),
                         [](const ::testing::TestParamInfo<DeepseekCase>& i) {
                           return std::string(i.param.name);
                         });

// What the training model does not build for DeepSeek is refused by name: the MoE layer of a dense block and
// recomputing a dense block's MoE MLP. Context parallelism is built (latent rows gathered).
TEST(TrainedDeepseek, WhatIsNotBuiltIsRefusedByName) {
  const Architecture a = training_architecture(deepseek_v3_test_model());
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  run_ranks(2, [&](Comm& world) {
    auto ep = world.split(world.rank(), 0, "ep");  // one rank each: the world is the CP group
    MoeTransformer model(a.config, {}, *ep, 0, a.features);
    EXPECT_NO_THROW(model.set_context_parallel(&world, 2));
    EXPECT_NO_THROW(model.set_context_parallel(ep.get(), 1)) << "a CP group of one rank is whole sequences";
    EXPECT_NE(error_of([&] { model.moe(0); }).find("block 0 is a dense MLP layer"), std::string::npos);
    EXPECT_EQ(&model.first_moe(), &model.moe(1));
    EXPECT_FALSE(model.recomputes_moe(0));
    EXPECT_NE(error_of([&] { model.set_recompute_moe(0, true); }).find("block 0 is a dense MLP layer"),
              std::string::npos);
    ModelExecution recompute;
    recompute.recompute_moe_layers = {0};
    EXPECT_NE(error_of([&] {
                MoeTransformer(a.config, recompute, *ep, 0, a.features);
              }).find("recompute_moe_layers names block 0, a dense MLP layer"),
              std::string::npos);
  });
}

// The step records of a 4-step run on 2 ranks (threads transport) with `cp` ranks per CP group and the
// experts over `ep` ranks, from the weights in `weights`; rank 0's records.
template <class M>
std::vector<StepRecord> two_rank_curve(const M& m, const fs::path& weights, int cp, int ep,
                                       double score_bias_rate, double aux_coef = -1.0) {
  TrainConfig c = family_run(m, weights, "");
  if (aux_coef >= 0.0) c.model.moe.router.aux_loss_coef = aux_coef;  // --aux-coef
  c.checkpoint_dir.clear();
  c.cp = cp;
  c.ep = ep;
  c.steps = 4;
  c.score_bias_rate = score_bias_rate;
  std::vector<StepRecord> curve;
  run_ranks(2, [&](Comm& world) {
    TrainSummary s = train(c, world, family_corpus(m.vocab));
    if (world.rank() == 0) curve = s.steps;
  });
  return curve;
}

// The losses of a short run with the experts on one EP rank each (EP 1, DP 2) and spread over both (EP 2)
// agree within the reduction-order tolerance of tests/train/ep_training_test.cpp (1e-4 relative per step).
template <class M>
void expect_ep_layouts_train_alike(const M& m, const std::string& tag, double score_bias_rate) {
  const fs::path weights = test::run_temp_dir("train_ep_layouts_" + tag);
  m.write(weights);
  std::vector<std::vector<StepRecord>> curves;
  for (int ep : {1, 2}) curves.push_back(two_rank_curve(m, weights, 1, ep, score_bias_rate));
  ASSERT_EQ(curves[0].size(), 4u);
  ASSERT_EQ(curves[1].size(), 4u);
  for (size_t i = 0; i < curves[0].size(); ++i)
    EXPECT_NEAR(curves[1][i].loss, curves[0][i].loss, 1e-4 * curves[0][i].loss) << tag << " step " << i;
  EXPECT_NE(curves[0].back().loss, curves[0].front().loss) << "training did not change the loss";
  fs::remove_all(weights);
}

TEST(TrainedDeepseek, EpLayoutsTrainToTheSameLosses) {
  expect_ep_layouts_train_alike(deepseek_v3_test_model(), "deepseek_v3", 1e-3);
  expect_ep_layouts_train_alike(deepseek_v2_test_model(), "deepseek_v2", 0.0);
  expect_ep_layouts_train_alike(qwen_dense_test_model(), "qwen_moe_dense", 0.0);
}

// Context parallelism with latent attention (nn::cp_latent_attention_forward: the chunks' latent rows are
// gathered): 2 ranks as one CP group of 2 (each holds half of every sequence; EP 2) train to the losses of
// the same 2 ranks with whole sequences (CP 1, DP 2, EP 2), within the tolerances of
// tests/train/cp_training_test.cpp: loss, load-balancing and z losses 1e-4 relative per step, the gradient
// norm 1e-3. Their config.json trains with DeepSeek's sequence-wise load-balancing loss (seq_aux true,
// aux_loss_alpha 0.001; moe/router.hpp), over each whole sequence at both; `aux_coef` >= 0 replaces its
// coefficient (a large one makes its gradient move the curve).
template <class M>
void expect_cp_trains_like_whole_sequences(const M& m, const std::string& tag, double score_bias_rate,
                                           double aux_coef = -1.0) {
  const fs::path weights = test::run_temp_dir("train_cp_" + tag);
  m.write(weights);
  const std::vector<StepRecord> whole = two_rank_curve(m, weights, 1, 2, score_bias_rate, aux_coef);
  const std::vector<StepRecord> chunks = two_rank_curve(m, weights, 2, 2, score_bias_rate, aux_coef);
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(chunks.size(), 4u);
  for (size_t i = 0; i < whole.size(); ++i) {
    const StepRecord &a = chunks[i], &b = whole[i];
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * b.loss) << tag << " step " << i;
    EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-4 * b.aux_loss) << tag << " step " << i;
    EXPECT_NEAR(a.z_loss, b.z_loss, 1e-4 * b.z_loss) << tag << " step " << i;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * b.grad_norm) << tag << " step " << i;
  }
  EXPECT_GT(whole.front().aux_loss, 0.0) << tag;
  const TrainConfig c = family_run(m, weights, "");
  EXPECT_EQ(c.model.moe.router.aux_loss_kind, AuxLossKind::Sequence) << tag;
  EXPECT_EQ(c.model.moe.router.aux_loss_coef, 0.001) << tag;
  if (aux_coef > 0.0) {
    // The loss's gradient moves the curve: the same run without it ends elsewhere.
    const std::vector<StepRecord> without = two_rank_curve(m, weights, 1, 2, score_bias_rate, 0.0);
    EXPECT_GT(std::fabs(without.back().loss - whole.back().loss), 1e-4 * whole.back().loss) << tag;
  }
  EXPECT_NE(whole.back().loss, whole.front().loss) << "training did not change the loss";
  fs::remove_all(weights);
}

TEST(TrainedDeepseek, CpTrainsToTheLossesOfWholeSequences) {
  expect_cp_trains_like_whole_sequences(deepseek_v3_test_model(), "deepseek_v3", 1e-3);
  expect_cp_trains_like_whole_sequences(deepseek_v2_test_model(), "deepseek_v2", 0.0);
  expect_cp_trains_like_whole_sequences(deepseek_v3_test_model(), "deepseek_v3_strong_aux", 1e-3, 1.0);
}

// `expar train --model` with a DeepSeek config.json trains with the load-balancing loss it names: seq_aux
// true (or absent) the sequence-wise loss with coefficient aux_loss_alpha (absent: 0.001), seq_aux false
// the router's batch form with aux_loss_alpha·K (DeepSeek's batch-wise loss); --aux-coef replaces the
// coefficient and keeps the form; a negative aux_loss_alpha is refused by name.
TEST(TrainedDeepseek, ConfigJsonChoosesTheLoadBalancingLoss) {
  const DeepseekTestModel m = deepseek_v3_test_model();
  auto router_of = [](const nlohmann::json& j) {
    return hf_architecture(j, "test config.json").config.moe.router;
  };
  nlohmann::json j = m.config();
  j["aux_loss_alpha"] = 0.02;
  RouterConfig r = router_of(j);
  EXPECT_EQ(r.aux_loss_kind, AuxLossKind::Sequence);
  EXPECT_EQ(r.aux_loss_coef, 0.02);
  j.erase("aux_loss_alpha");
  j.erase("seq_aux");
  r = router_of(j);
  EXPECT_EQ(r.aux_loss_kind, AuxLossKind::Sequence);
  EXPECT_EQ(r.aux_loss_coef, 0.001);
  j["seq_aux"] = false;
  j["aux_loss_alpha"] = 0.02;
  r = router_of(j);
  EXPECT_EQ(r.aux_loss_kind, AuxLossKind::Batch);
  EXPECT_DOUBLE_EQ(r.aux_loss_coef, 0.02 * m.top_k);
  j["aux_loss_alpha"] = -1.0;
  try {
    router_of(j);
    ADD_FAILURE() << "a negative aux_loss_alpha was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'aux_loss_alpha' = -1.0: must not be negative"), std::string::npos)
        << e.what();
  }
  // The run's model from the file, then with --aux-coef.
  const fs::path dir = test::run_temp_dir("train_deepseek_aux_config");
  std::ofstream(dir / "config.json") << m.config().dump(2);
  RunModelRequest request;
  request.model = (dir / "config.json").string();
  RunModel run = resolve_run_model(request);
  EXPECT_EQ(run.model.moe.router.aux_loss_kind, AuxLossKind::Sequence);
  EXPECT_EQ(run.model.moe.router.aux_loss_coef, 0.001);
  request.aux_loss_coef = 0.05;
  run = resolve_run_model(request);
  EXPECT_EQ(run.model.moe.router.aux_loss_kind, AuxLossKind::Sequence);
  EXPECT_EQ(run.model.moe.router.aux_loss_coef, 0.05);
  fs::remove_all(dir);
}

// Fine-tuning DeepSeek-V3 from its block-scaled FP8 release: the load dequantises the projections with their
// _scale_inv multipliers, and the training model (on 2 EP ranks) computes the reference over the values the
// blocks encode (1e-5); a fine-tuning step saves F32 weights, without the multipliers or quantization_config,
// that the engine (TP 2) reads like the training model.
TEST(TrainedDeepseek, Fp8WeightsAreDequantisedForFineTuning) {
  DeepseekTestModel m = deepseek_v3_test_model();
  const Fp8Checkpoint q = fp8_quantised(m.tensors);
  ASSERT_EQ(q.stored.at("model.layers.0.mlp.gate_proj.weight").dtype(), DType::F8E4M3);
  ASSERT_EQ(q.stored.at("model.layers.1.self_attn.kv_b_proj.weight").dtype(), DType::F8E4M3);
  const fs::path dir = test::run_temp_dir("train_deepseek_fp8");
  write_sharded_checkpoint(dir, q.stored, 64 * 1024);
  const nlohmann::json config = fp8_config(m.config());
  std::ofstream(dir / "config.json") << config.dump(2);
  m.tensors = q.dequantised;
  const Architecture a = hf_architecture(config, "test config.json");
  ModelExecution block;
  block.moe.path = "block";
  const std::vector<int32_t> prompt = vocab_tokens(13, 9, m.vocab);
  const Tensor want = m.dense_logits(prompt);
  run_ranks(2, [&](Comm& world) {
    MoeTransformer model(a.config, block, world, 0, a.features);
    model.init(1);
    load_hf_weights(dir, a.format, model);
    EXPECT_TRUE(close(model.logits(prompt, 1, 9), want, 1e-5)) << "rank " << world.rank();
  });
  const fs::path run = test::run_temp_dir("train_deepseek_fp8_run");
  TrainConfig c = family_run(m, dir, run);
  c.hf_config_json = config.dump(2);
  c.steps = 1;
  run_ranks(2, [&](Comm& world) { train(c, world, family_corpus(m.vocab)); });
  const fs::path step = run / "step-1";
  EXPECT_FALSE(read_hf_config_json(step).contains("quantization_config"));
  ShardedCheckpoint index = ShardedCheckpoint::open_directory(step);
  EXPECT_EQ(index.info("model.layers.0.mlp.gate_proj.weight").dtype, DType::F32);
  EXPECT_EQ(index.info("model.layers.2.mlp.experts.3.up_proj.weight").dtype, DType::F32);
  for (const std::string& name : index.names()) EXPECT_FALSE(name.ends_with("_scale_inv")) << name;
  EXPECT_FALSE(close(logits_of_save(run, m, prompt), want, 1e-3)) << "the fine-tuning step changed nothing";
  for (const fs::path& p : {dir, run}) fs::remove_all(p);
}

// Fine-tuning gpt-oss from its MXFP4 release: the trainer's load dequantises this rank's experts, and the
// training model (on 2 EP ranks) computes the dense reference over the values the blocks encode; the run's
// save is an F32 gpt-oss checkpoint the engine reads.
TEST(TrainedFamilies, GptOssMxfp4ExpertsAreDequantisedForFineTuning) {
  HfTestModel m = gpt_oss_test_model(64, 32);
  const std::map<std::string, Tensor> file = quantise_gpt_oss_experts(m);
  const fs::path dir = test::run_temp_dir("train_mxfp4");
  write_sharded_checkpoint(dir, file, 64 * 1024);
  std::ofstream(dir / "config.json") << mxfp4_config(m).dump(2);
  Architecture a = hf_architecture(mxfp4_config(m), "test config.json");
  ModelExecution block;
  block.moe.path = "block";
  const std::vector<int32_t> prompt = vocab_tokens(13, 9, m.vocab);
  const Tensor want = m.dense_logits(prompt);
  run_ranks(2, [&](Comm& world) {
    MoeTransformer model(a.config, block, world, 0, a.features);
    model.init(1);
    load_hf_weights(dir, a.format, model);
    EXPECT_TRUE(close(model.logits(prompt, 1, 9), want, 1e-4)) << "rank " << world.rank();
  });
  // A fine-tuning run from it saves F32 experts under the family's names, with a config.json that no longer
  // says quantised, and the engine (TP 2) reads the save like the training model does.
  const fs::path run = test::run_temp_dir("train_mxfp4_run");
  TrainConfig c = family_run(m, dir, run);
  c.hf_config_json = mxfp4_config(m).dump(2);
  c.steps = 1;
  run_ranks(2, [&](Comm& world) { train(c, world, family_corpus(m.vocab)); });
  const fs::path step = run / "step-1";
  EXPECT_FALSE(read_hf_config_json(step).contains("quantization_config"));
  ShardedCheckpoint index = ShardedCheckpoint::open_directory(step);
  EXPECT_EQ(index.info("model.layers.0.mlp.experts.gate_up_proj").dtype, DType::F32);
  EXPECT_FALSE(index.contains("model.layers.0.mlp.experts.gate_up_proj_blocks"));
  EXPECT_FALSE(close(logits_of_save(run, m, prompt), want, 1e-3))
      << "the fine-tuning step did not change the model";
  for (const fs::path& p : {dir, run}) fs::remove_all(p);
}

}  // namespace
}  // namespace expar::infer::testing
