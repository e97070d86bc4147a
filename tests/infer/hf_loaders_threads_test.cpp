// Hugging Face layouts: a Mixtral checkpoint (sharded, with model.safetensors.index.json and config.json)
// written from our model runs through the engine with EP and matches the single-rank reference; the
// Qwen-MoE and gpt-oss expert loaders return the right experts and intermediate shards of tiny synthetic
// files (gpt-oss: the shards' partial outputs of the clamped SwiGLU expert sum to the whole expert's).
#include <gtest/gtest.h>

#include <cmath>

#include "common/random_tensor.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/generate.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/model/hf_experts.hpp"
#include "infer_test_util.hpp"

namespace expar::infer {
namespace {

using namespace testing;
using test::randn;

float at(const Tensor& t, std::initializer_list<int64_t> index) {
  int64_t flat = 0, i = 0;
  for (int64_t v : index) flat = flat * t.dim(static_cast<int>(i++)) + v;
  return t.data<float>()[flat];
}

TEST(HfLoaders, MixtralCheckpointRunsWithExpertParallelismAndMatchesTheReference) {
  const fs::path dir = test::run_temp_dir("mixtral");
  ModelConfig config = test_config();
  config.shared_expert_hidden = 0;  // Mixtral has no shared expert
  const std::vector<int32_t> prompt = random_tokens(21, 6);
  Tensor want;
  std::vector<int32_t> greedy;
  MemoryTracker& host = current_tracker();
  run_ranks(1, [&](Comm& world) {
    auto group = world.split(0, 0, "ep");
    MoeTransformer model(config, {}, *group);
    model.init(8);
    std::map<std::string, Tensor> t;
    for (Parameter& p : model.parameters()) {
      const std::string& n = p.name;
      if (n == "embed") t["model.embed_tokens.weight"] = p.value;
      if (n == "final_norm") t["model.norm.weight"] = p.value;
      if (n == "lm_head") t["lm_head.weight"] = p.value;
      if (!n.starts_with("layers.")) continue;
      const int l = std::stoi(n.substr(7));
      const std::string hf = "model.layers." + std::to_string(l);
      const std::string key = n.substr(n.find('.', 7) + 1);
      static const std::map<std::string, std::string> dense{
          {"attn_norm", ".input_layernorm.weight"},       {"mlp_norm", ".post_attention_layernorm.weight"},
          {"attn.wq", ".self_attn.q_proj.weight"},        {"attn.wk", ".self_attn.k_proj.weight"},
          {"attn.wv", ".self_attn.v_proj.weight"},        {"attn.wo", ".self_attn.o_proj.weight"},
          {"moe.router", ".block_sparse_moe.gate.weight"}};
      if (dense.count(key)) t[hf + dense.at(key)] = p.value;
      if (key.starts_with("moe.experts."))
        for (int e = 0; e < config.moe.router.num_experts; ++e)
          t[hf + ".block_sparse_moe.experts." + std::to_string(e) + "." + key.substr(12) + ".weight"] =
              p.value.rows(e, e + 1).reshape({p.value.dim(1), p.value.dim(2)});
    }
    write_sharded_checkpoint(dir, t, 64 * 1024);
    want = export_to(host, model.logits(prompt, 1, 6));
    std::vector<int32_t> seq = prompt;
    for (int i = 0; i < 4; ++i) {
      Tensor logits = model.logits(seq, 1, static_cast<int64_t>(seq.size()));
      greedy.push_back(argmax_row(logits, logits.dim(0) - 1));
      seq.push_back(greedy.back());
    }
  });
  nlohmann::json cfg{{"model_type", "mixtral"},
                     {"vocab_size", config.vocab},
                     {"hidden_size", config.model_dim},
                     {"num_hidden_layers", config.layers},
                     {"num_attention_heads", config.heads},
                     {"num_key_value_heads", config.kv_heads},
                     {"head_dim", config.head_dim},
                     {"max_position_embeddings", config.max_seq},
                     {"rms_norm_eps", config.norm_eps},
                     {"rope_theta", config.rope_theta},
                     {"num_local_experts", config.moe.router.num_experts},
                     {"num_experts_per_tok", config.moe.router.top_k},
                     {"intermediate_size", config.moe.hidden_dim}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));

  const ModelConfig loaded = mixtral_config(dir);
  EXPECT_EQ(loaded.moe.router.num_experts, 24);
  EXPECT_TRUE(loaded.moe.router.renormalize);
  InferenceConfig ic;
  ic.tp = 4;
  ic.enable_expert_parallel = true;
  ic.ep_degree = 2;  // variable EP
  ic.num_experts = loaded.moe.router.num_experts;
  const InferenceLayout layout(ic);
  run_ranks(4, [&](Comm& world) {
    auto store = ShardedStore::open(dir);
    RankWeights w = load_rank_weights(*store, mixtral_weight_names(), loaded, layout, world.rank());
    // The dedicated Mixtral expert loader gives the same tensors as the generic one.
    const auto [i0, i1] = layout.intermediate_shard(world.rank(), 12);
    ExpertWeights direct = load_mixtral_experts(*store, 1, w.local_experts, i0, i1);
    EXPECT_TRUE(close(direct.w2, w.layers[1].experts.w2, 0.0));
    EXPECT_TRUE(close(direct.w1, w.layers[1].experts.w1, 0.0));
    Engine engine(layout, world, std::move(w));
    const int id = engine.add_sequence(8);
    EXPECT_TRUE(close(engine.prefill(std::vector<int>{id}, {prompt}), want));
  });
  GenerateOptions o;
  o.tp = 2;
  o.enable_expert_parallel = true;
  EXPECT_EQ(generate(o, dir.string(), prompt, 4).tokens, greedy);
  fs::remove_all(dir);
}

TEST(HfLoaders, QwenMoeExpertsAndSharedExpert) {
  const fs::path dir = test::run_temp_dir("qwen");
  const int64_t E = 4, H = 6, I = 4;
  std::map<std::string, Tensor> t;
  const std::string p = "model.layers.0.mlp.";
  for (int e = 0; e < E; ++e) {
    t[p + "experts." + std::to_string(e) + ".gate_proj.weight"] = randn({I, H}, 10 + e);
    t[p + "experts." + std::to_string(e) + ".up_proj.weight"] = randn({I, H}, 20 + e);
    t[p + "experts." + std::to_string(e) + ".down_proj.weight"] = randn({H, I}, 30 + e);
  }
  t[p + "shared_expert.gate_proj.weight"] = randn({8, H}, 40);
  t[p + "shared_expert.up_proj.weight"] = randn({8, H}, 41);
  t[p + "shared_expert.down_proj.weight"] = randn({H, 8}, 42);
  t[p + "shared_expert_gate.weight"] = randn({1, H}, 43);
  t[p + "gate.weight"] = randn({E, H}, 44);
  write_safetensors(dir / "model.safetensors", t);
  auto store = ShardedStore::open(dir);
  const std::vector<int> local{3, 1};  // round-robin style order: the output follows it
  ExpertWeights w = load_qwen_moe_experts(*store, 0, local, 2, 4);
  ASSERT_EQ(w.w1.shape(), (Shape{2, 2, H}));
  ASSERT_EQ(w.w2.shape(), (Shape{2, H, 2}));
  for (int l = 0; l < 2; ++l) {
    const std::string e = std::to_string(local[static_cast<size_t>(l)]);
    const Tensor& gate = t[p + "experts." + e + ".gate_proj.weight"];
    const Tensor& up = t[p + "experts." + e + ".up_proj.weight"];
    const Tensor& down = t[p + "experts." + e + ".down_proj.weight"];
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t c = 0; c < H; ++c) {
        EXPECT_EQ(at(w.w1, {l, i, c}), at(gate, {2 + i, c}));
        EXPECT_EQ(at(w.w3, {l, i, c}), at(up, {2 + i, c}));
        EXPECT_EQ(at(w.w2, {l, c, i}), at(down, {c, 2 + i}));
      }
  }
  QwenSharedExpert s = load_qwen_shared_expert(*store, 0, 4, 8);
  EXPECT_EQ(s.w1.shape(), (Shape{4, H}));
  EXPECT_EQ(s.w2.shape(), (Shape{H, 4}));
  EXPECT_EQ(at(s.w2, {5, 3}), at(t[p + "shared_expert.down_proj.weight"], {5, 7}));
  EXPECT_EQ(at(s.w1, {0, 0}), at(t[p + "shared_expert.gate_proj.weight"], {4, 0}));
  EXPECT_TRUE(close(s.gate, t[p + "shared_expert_gate.weight"], 0.0));
  EXPECT_THROW(load_qwen_moe_experts(*store, 0, std::vector<int>{7}, 0, 4), Error);  // no expert 7
  fs::remove_all(dir);
}

TEST(HfLoaders, GptOssClampedSwigluClampsGateAboveAndUpBothWays) {
  auto ref = [](float g, float u) { return g / (1.0f + std::exp(-1.702f * g)) * (u + 1.0f); };
  EXPECT_FLOAT_EQ(gpt_oss_swiglu(0.5f, 0.25f), ref(0.5f, 0.25f));
  EXPECT_FLOAT_EQ(gpt_oss_swiglu(9.0f, 0.25f), ref(7.0f, 0.25f));
  EXPECT_FLOAT_EQ(gpt_oss_swiglu(-9.0f, 0.25f), ref(-9.0f, 0.25f));  // gate has no lower clamp
  EXPECT_FLOAT_EQ(gpt_oss_swiglu(1.0f, 8.0f), ref(1.0f, 7.0f));
  EXPECT_FLOAT_EQ(gpt_oss_swiglu(1.0f, -8.0f), ref(1.0f, -7.0f));
}

TEST(HfLoaders, GptOssShardsOfTheFusedGateUpSumToTheWholeExpert) {
  const fs::path dir = test::run_temp_dir("gptoss");
  const int64_t E = 4, H = 6, I = 4;
  std::map<std::string, Tensor> t;
  const std::string p = "model.layers.0.mlp.experts.";
  t[p + "gate_up_proj"] = randn({E, H, 2 * I}, 1);
  t[p + "gate_up_proj_bias"] = randn({E, 2 * I}, 2);
  t[p + "down_proj"] = randn({E, I, H}, 3);
  t[p + "down_proj_bias"] = randn({E, H}, 4);
  write_safetensors(dir / "model.safetensors", t);
  auto store = ShardedStore::open(dir);
  const Tensor x = randn({H}, 5);
  // The whole expert as Hugging Face computes it: x @ gate_up + b, gate = even, up = odd columns.
  auto whole = [&](int e) {
    std::vector<float> y(static_cast<size_t>(H));
    for (int64_t c = 0; c < H; ++c) y[static_cast<size_t>(c)] = at(t[p + "down_proj_bias"], {e, c});
    for (int64_t i = 0; i < I; ++i) {
      float g = at(t[p + "gate_up_proj_bias"], {e, 2 * i}),
            u = at(t[p + "gate_up_proj_bias"], {e, 2 * i + 1});
      for (int64_t h = 0; h < H; ++h) {
        g += x.data<float>()[h] * at(t[p + "gate_up_proj"], {e, h, 2 * i});
        u += x.data<float>()[h] * at(t[p + "gate_up_proj"], {e, h, 2 * i + 1});
      }
      const float a = gpt_oss_swiglu(g, u);
      for (int64_t c = 0; c < H; ++c) y[static_cast<size_t>(c)] += a * at(t[p + "down_proj"], {e, i, c});
    }
    return y;
  };
  const std::vector<int> local{2, 3};
  std::vector<std::vector<float>> sum(local.size(), std::vector<float>(static_cast<size_t>(H), 0.0f));
  for (int shard = 0; shard < 2; ++shard) {
    GptOssExperts g = load_gpt_oss_experts(*store, 0, local, shard * 2, shard * 2 + 2, shard == 0);
    ASSERT_EQ(g.weights.w1.shape(), (Shape{2, 2, H}));
    ASSERT_EQ(g.weights.w2.shape(), (Shape{2, H, 2}));
    EXPECT_EQ(g.b2.defined() && g.b2.numel() > 0, shard == 0);
    for (size_t l = 0; l < local.size(); ++l) {
      const auto li = static_cast<int64_t>(l);
      for (int64_t c = 0; c < H; ++c)
        if (shard == 0) sum[l][static_cast<size_t>(c)] += at(g.b2, {li, c});
      for (int64_t i = 0; i < 2; ++i) {
        float gate = at(g.b1, {li, i}), up = at(g.b3, {li, i});
        for (int64_t h = 0; h < H; ++h) {
          gate += at(g.weights.w1, {li, i, h}) * x.data<float>()[h];
          up += at(g.weights.w3, {li, i, h}) * x.data<float>()[h];
        }
        const float a = gpt_oss_swiglu(gate, up);
        for (int64_t c = 0; c < H; ++c) sum[l][static_cast<size_t>(c)] += a * at(g.weights.w2, {li, c, i});
      }
    }
  }
  for (size_t l = 0; l < local.size(); ++l) {
    const auto want = whole(local[l]);
    for (int64_t c = 0; c < H; ++c)
      EXPECT_NEAR(sum[l][static_cast<size_t>(c)], want[static_cast<size_t>(c)],
                  1e-4f * (1 + std::fabs(want[static_cast<size_t>(c)])))
          << "expert " << local[l] << " output " << c;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace expar::infer
