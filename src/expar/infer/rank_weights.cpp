#include "expar/infer/rank_weights.hpp"

#include "expar/core/error.hpp"
#include "expar/infer/weight_loader.hpp"

namespace expar::infer {

WeightNames expar_weight_names() {
  WeightNames n;
  n.embed = "embed";
  n.final_norm = "final_norm";
  n.lm_head = "lm_head";
  n.layer = [](int l, const std::string& key) {
    const std::string p = "layers." + std::to_string(l);
    if (key == "attn_norm" || key == "mlp_norm") return p + "." + key;
    if (key == "router" || key == "score_bias") return p + ".moe." + key;
    return p + ".attn." + key;
  };
  n.expert = [](int l, int e, const std::string& key) {
    return "layers." + std::to_string(l) + ".moe.experts." + std::to_string(e) + "." + key;
  };
  n.shared = [](int l, const std::string& key) { return "layers." + std::to_string(l) + ".shared." + key; };
  return n;
}

WeightNames mixtral_weight_names() {
  WeightNames n;
  n.embed = "model.embed_tokens.weight";
  n.final_norm = "model.norm.weight";
  n.lm_head = "lm_head.weight";
  n.layer = [](int l, const std::string& key) {
    const std::string p = "model.layers." + std::to_string(l);
    if (key == "attn_norm") return p + ".input_layernorm.weight";
    if (key == "mlp_norm") return p + ".post_attention_layernorm.weight";
    if (key == "router") return p + ".block_sparse_moe.gate.weight";
    if (key == "score_bias") return p + ".block_sparse_moe.score_bias";  // never present: Mixtral has none
    const std::string proj = key == "wq"   ? "q_proj"
                             : key == "wk" ? "k_proj"
                             : key == "wv" ? "v_proj"
                                           : "o_proj";
    return p + ".self_attn." + proj + ".weight";
  };
  n.expert = [](int l, int e, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(e) + "." +
           key + ".weight";
  };
  n.shared = [](int l, const std::string& key) {
    return "model.layers." + std::to_string(l) + ".shared_expert." + key + ".weight";  // never present
  };
  return n;
}

namespace {

// The query heads [q0, q1) and key/value heads [k0, k1) held by TP rank t.
struct HeadSplit {
  int64_t q0, q1, k0, k1;
};

HeadSplit head_split(const ModelConfig& c, int tp, int t) {
  EXPAR_CHECK(c.heads % tp == 0,
              "heads={} is not divisible by tensor_parallel_size={}: choose a TP size that divides the "
              "number of attention heads",
              c.heads, tp);
  const int64_t qh = c.heads / tp;
  HeadSplit s{t * qh, (t + 1) * qh, 0, 0};
  if (c.kv_heads % tp == 0) {
    const int64_t kh = c.kv_heads / tp;
    s.k0 = t * kh;
    s.k1 = (t + 1) * kh;
  } else {
    EXPAR_CHECK(tp % c.kv_heads == 0,
                "kv_heads={} and tensor_parallel_size={}: one must divide the other (key/value heads are "
                "split over TP, or replicated when TP exceeds them)",
                c.kv_heads, tp);
    s.k0 = s.q0 / (c.heads / c.kv_heads);  // every local query head uses this one key/value head
    s.k1 = s.k0 + 1;
  }
  return s;
}

// Checks the stored shape before a slice of it is taken, so a config that does not match the checkpoint
// fails with both shapes instead of loading the wrong rows.
void expect_shape(const TensorStore& store, const std::string& name, const Shape& want) {
  const TensorInfo& info = store.info(name);
  EXPAR_CHECK(info.shape == want,
              "checkpoint '{}': tensor '{}' has shape {} but the model config needs {}: the config does not "
              "match the weights",
              store.label(), name, shape_string(info.shape), shape_string(want));
}

}  // namespace

RankWeights load_rank_weights(const TensorStore& store, const WeightNames& names, const ModelConfig& config,
                              const InferenceLayout& layout, int rank) {
  const InferenceRankInfo info = layout.rank_info(rank);
  EXPAR_CHECK(layout.placement().num_experts() == config.moe.num_experts,
              "the inference layout has {} experts but the model has {}: build the layout with "
              "num_experts={}",
              layout.placement().num_experts(), config.moe.num_experts, config.moe.num_experts);
  RankWeights w;
  w.config = config;
  w.config.moe.model_dim = config.model_dim;
  w.local_experts = info.local_experts;
  const HeadSplit hs = head_split(config, layout.tp(), info.tp_rank);
  const int64_t hd = config.head_dim;
  w.local_attn = nn::AttentionShape{hs.q1 - hs.q0, hs.k1 - hs.k0, hd};
  const auto [i0, i1] = layout.intermediate_shard(rank, static_cast<int>(config.moe.hidden_dim));

  expect_shape(store, names.embed, {config.vocab, config.model_dim});
  expect_shape(store, names.lm_head, {config.vocab, config.model_dim});
  w.embed = load_dense(store, names.embed);
  w.final_norm = load_dense(store, names.final_norm);
  w.lm_head = load_dense(store, names.lm_head);
  for (int l = 0; l < config.layers; ++l) {
    LayerWeights lw;
    auto name = [&](const char* key) { return names.layer(l, key); };
    lw.attn_norm = load_dense(store, name("attn_norm"));
    lw.mlp_norm = load_dense(store, name("mlp_norm"));
    const int64_t d = config.model_dim;
    expect_shape(store, name("wq"), {config.heads * hd, d});
    expect_shape(store, name("wk"), {config.kv_heads * hd, d});
    expect_shape(store, name("wv"), {config.kv_heads * hd, d});
    expect_shape(store, name("wo"), {d, config.heads * hd});
    lw.attn.wq = load_rows(store, name("wq"), hs.q0 * hd, hs.q1 * hd);
    lw.attn.wk = load_rows(store, name("wk"), hs.k0 * hd, hs.k1 * hd);
    lw.attn.wv = load_rows(store, name("wv"), hs.k0 * hd, hs.k1 * hd);
    lw.attn.wo = load_columns(store, name("wo"), hs.q0 * hd, hs.q1 * hd);
    lw.router = load_dense(store, name("router"));  // replicated: the standard (non-EP) loader
    EXPAR_CHECK(lw.router.ndim() == 2 && lw.router.dim(0) == config.moe.num_experts,
                "router '{}' has shape {} but the model has {} experts", name("router"),
                shape_string(lw.router.shape()), config.moe.num_experts);
    if (store.contains(name("score_bias"))) lw.score_bias = load_dense(store, name("score_bias"));
    // Seed 002's composition: a TP-sharding base loader (gate/up rows, down columns of the intermediate
    // shard) wrapped by the expert-parallel loader that keeps this rank's experts.
    for (int e : info.local_experts) {
      const int64_t h = config.moe.hidden_dim;
      expect_shape(store, names.expert(l, e, "w1"), {h, d});
      expect_shape(store, names.expert(l, e, "w3"), {h, d});
      expect_shape(store, names.expert(l, e, "w2"), {d, h});
    }
    auto view = [&](const char* key) {
      return per_expert_view(store,
                             [&names, l, k = std::string(key)](int e) { return names.expert(l, e, k); });
    };
    lw.experts.w1 = expert_parallel_weight_loader(info.local_experts, rows_loader(view("w1"), i0, i1));
    lw.experts.w3 = expert_parallel_weight_loader(info.local_experts, rows_loader(view("w3"), i0, i1));
    lw.experts.w2 = expert_parallel_weight_loader(info.local_experts, columns_loader(view("w2"), i0, i1));
    lw.experts.validate();
    if (config.shared_expert_hidden > 0) {
      const int64_t h = config.shared_expert_hidden;
      const int tp = layout.tp(), t = info.tp_rank;
      int64_t s0 = 0, s1 = 0;
      if (h % tp == 0) {
        s0 = t * (h / tp);
        s1 = (t + 1) * (h / tp);
      } else if (t == 0) {
        s1 = h;
      }
      if (s1 > s0) {
        lw.shared_w1 = load_rows(store, names.shared(l, "w1"), s0, s1);
        lw.shared_w3 = load_rows(store, names.shared(l, "w3"), s0, s1);
        lw.shared_w2 = load_columns(store, names.shared(l, "w2"), s0, s1);
      }
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace expar::infer
