#include "expar/infer/rank_weights.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/core/weight_view.hpp"
#include "expar/infer/load_progress.hpp"
#include "expar/model/hf_experts.hpp"
#include "expar/model/weight_loader.hpp"

namespace expar::infer {

namespace {

// Checks the stored shape before a slice of it is taken, so a config that does not match the checkpoint
// fails with both shapes instead of loading the wrong rows.
void expect_shape(const TensorStore& store, const std::string& name, const Shape& want) {
  const TensorInfo& info = store.info(name);
  EXPAR_CHECK(info.shape == want,
              "checkpoint '{}': tensor '{}' has shape {} but the model config needs {}: the config does not "
              "match the weights",
              store.label(), name, shape_string(info.shape), shape_string(want));
}

// Whether two weight matrices of the same shape hold the same values, whatever dtype each is held in.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype())
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  const WeightView va = weight_view(a), vb = weight_view(b);
  std::vector<float> ra(static_cast<size_t>(va.cols)), rb(ra.size());
  for (int64_t r = 0; r < va.rows; ++r) {
    dequantize_rows(va, r, r + 1, ra.data(), va.cols);
    dequantize_rows(vb, r, r + 1, rb.data(), vb.cols);
    if (ra != rb) return false;
  }
  return true;
}

}  // namespace

int64_t layer_bytes(const LayerWeights& lw) {
  int64_t b = lw.experts.bytes();
  for (const Tensor* t : {&lw.attn_norm,
                          &lw.mlp_norm,
                          &lw.attn.wq,
                          &lw.attn.wk,
                          &lw.attn.wv,
                          &lw.attn.wo,
                          &lw.router,
                          &lw.score_bias,
                          &lw.router_bias,
                          &lw.shared_w1,
                          &lw.shared_w3,
                          &lw.shared_w2,
                          &lw.shared_gate,
                          &lw.attn_options.bq,
                          &lw.attn_options.bk,
                          &lw.attn_options.bv,
                          &lw.attn_options.bo,
                          &lw.attn_options.sinks,
                          &lw.attn_options.q_norm,
                          &lw.attn_options.k_norm,
                          &lw.mla.wq,
                          &lw.mla.wq_a,
                          &lw.mla.q_a_norm,
                          &lw.mla.wq_b,
                          &lw.mla.wkv_a,
                          &lw.mla.kv_a_norm,
                          &lw.mla.wkv_b,
                          &lw.mla.wo,
                          &lw.dense_w1,
                          &lw.dense_w3,
                          &lw.dense_w2})
    b += weight_bytes(*t);
  return b;
}

LoadProgress& load_progress() {
  static LoadProgress progress;
  return progress;
}

std::pair<int64_t, int64_t> mlp_shard(int64_t h, int tp, int t) {
  if (h % tp == 0) return {t * (h / tp), (t + 1) * (h / tp)};
  return t == 0 ? std::pair<int64_t, int64_t>{0, h} : std::pair<int64_t, int64_t>{0, 0};
}

nn::LatentAttentionShape latent_shape(const LatentAttentionDims& a, int64_t local_heads) {
  nn::LatentAttentionShape s;
  s.n_heads = local_heads;
  s.q_lora_rank = a.q_lora_rank;
  s.kv_lora_rank = a.kv_lora_rank;
  s.qk_nope_head_dim = a.qk_nope_head_dim;
  s.qk_rope_head_dim = a.qk_rope_head_dim;
  s.v_head_dim = a.v_head_dim;
  s.softmax_scale = a.softmax_scale;
  return s;
}

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

std::vector<std::string> weight_dtype_names() {
  return {"bf16", "fp8"};
}

DType weight_dtype_from_name(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  EXPAR_CHECK(name == "fp8", "--weight-dtype {}: expar converts weights at load to {}", name,
              fmt::join(weight_dtype_names(), ", "));
  return DType::F8E4M3;
}

RankWeights load_rank_weights(const TensorStore& store, const WeightNames& names, const ModelConfig& config,
                              const InferenceLayout& layout, int rank, const ModelFeatures& features,
                              std::optional<DType> weight_dtype) {
  EXPAR_CHECK(!weight_dtype || *weight_dtype == DType::BF16 || *weight_dtype == DType::F8E4M3,
              "weights convert at load to BF16 or FP8, not {}", dtype_name(*weight_dtype));
  // A product's weight in the dtype asked for: BF16 from F32 (BF16 and F16 stay as stored); block-scaled FP8
  // from F32, BF16 and F16 (FP8 and MXFP4 stay as stored).
  auto convert = [&](Tensor t, MemCategory category) {
    if (!weight_dtype) return t;
    if (*weight_dtype == DType::BF16) return t.dtype() == DType::F32 ? to_bf16(t, category) : t;
    if (t.dtype() == DType::F16) t = to_f32(t, category);
    return t.dtype() == DType::F32 || t.dtype() == DType::BF16 ? to_fp8_blocks(t, category) : t;
  };
  auto product_weight = [&](Tensor t) {
    const MemCategory category = t.category();
    return convert(std::move(t), category);
  };
  // Rows [begin, end) of a product's weight (load_rows_as_stored), converted where a dtype is asked for
  // straight from the store's rows: no copy in the checkpoint's dtype is made beside the converted one, and
  // the mapped pages read go back at once, so neither stays resident (the same values as converting a copy).
  auto product_rows = [&](const std::string& n, int64_t begin, int64_t end) {
    if (weight_dtype) {
      const Tensor v = store.view_rows(n, begin, end);
      Tensor converted = convert(v, MemCategory::DenseWeights);
      if (converted.raw() != v.raw()) {
        store.release_rows(n, begin, end);
        return converted;
      }
    }
    return product_weight(load_rows_as_stored(store, n, begin, end));
  };
  const InferenceRankInfo info = layout.rank_info(rank);
  EXPAR_ASSERT(layout.placement().num_experts() == config.moe.router.num_experts,
               "the inference layout has {} experts but the model has {}: build the layout with "
               "num_experts={}",
               layout.placement().num_experts(), config.moe.router.num_experts,
               config.moe.router.num_experts);
  RankWeights w;
  w.config = config;
  w.config.moe.model_dim = config.model_dim;
  w.features = features;
  w.local_experts = info.local_experts;
  const HeadSplit hs = head_split(config, layout.tp(), info.tp_rank);
  const int64_t hd = config.head_dim;
  w.local_attn = nn::AttentionShape{hs.q1 - hs.q0, hs.k1 - hs.k0, hd};
  const LatentAttentionDims& mla = features.mla;
  if (mla.enabled()) w.local_latent = latent_shape(mla, hs.q1 - hs.q0);
  const auto [i0, i1] = layout.intermediate_shard(rank, static_cast<int>(config.moe.hidden_dim));
  const int64_t d = config.model_dim;

  expect_shape(store, names.embed, {config.vocab, d});
  // The vocabulary slice of this TP rank (the engine's embed/lm_head split it the same way).
  const int64_t v0 = config.vocab * info.tp_rank / layout.tp(),
                v1 = config.vocab * (info.tp_rank + 1) / layout.tp();
  w.vocab_begin = v0;
  // Both are held in the checkpoint's dtype (F32, BF16 or F16) and multiplied as stored
  // (core/weight_view.hpp). The table is gathered one row per token, so it stays in the file where it can;
  // tied to the LM head it is streamed whole every step, and copied like the other streamed weights.
  w.embed = features.tied_embeddings ? product_rows(names.embed, v0, v1)
                                     : map_rows_as_stored(store, names.embed, v0, v1);
  w.final_norm = load_dense(store, names.final_norm);
  if (features.tied_embeddings) {
    w.lm_head = w.embed;  // tie_word_embeddings: the LM head is the embedding (read-only here)
    if (store.contains(names.lm_head)) {
      // Which of two different tensors a tied model uses depends on the loader's order: refuse rather than
      // pick one (each rank compares its slice; a difference anywhere fails on the rank holding it).
      expect_shape(store, names.lm_head, {config.vocab, d});
      const Tensor head = product_rows(names.lm_head, v0, v1);
      EXPAR_CHECK(
          same_values(head, w.embed),
          "checkpoint '{}': config.json sets tie_word_embeddings true but '{}' differs from '{}': set "
          "tie_word_embeddings false to use the LM head, or remove '{}'",
          store.label(), names.lm_head, names.embed, names.lm_head);
    }
  } else {
    expect_shape(store, names.lm_head, {config.vocab, d});
    w.lm_head = product_rows(names.lm_head, v0, v1);
  }
  // A SwiGLU MLP of width h (names(l, "w1" | "w3" | "w2")) sharded over TP by mlp_shard; false where this
  // rank holds none of it.
  auto load_tp_mlp = [&](const std::function<std::string(int, const std::string&)>& mlp_name, int l,
                         int64_t h, Tensor& w1, Tensor& w3, Tensor& w2) {
    expect_shape(store, mlp_name(l, "w1"), {h, d});
    expect_shape(store, mlp_name(l, "w3"), {h, d});
    expect_shape(store, mlp_name(l, "w2"), {d, h});
    const auto [s0, s1] = mlp_shard(h, layout.tp(), info.tp_rank);
    if (s1 <= s0) return false;
    w1 = product_rows(mlp_name(l, "w1"), s0, s1);
    w3 = product_rows(mlp_name(l, "w3"), s0, s1);
    w2 = product_weight(load_columns_as_stored(store, mlp_name(l, "w2"), s0, s1));
    return true;
  };
  load_progress().bytes += weight_bytes(w.embed) + weight_bytes(w.final_norm) +
                           (features.tied_embeddings ? 0 : weight_bytes(w.lm_head));
  ++load_progress().parts;
  for (int l = 0; l < config.layers; ++l) {
    LayerWeights lw;
    auto name = [&](const char* key) { return names.layer(l, key); };
    lw.attn_norm = load_dense(store, name("attn_norm"));
    lw.mlp_norm = load_dense(store, name("mlp_norm"));
    if (mla.enabled()) {
      // Latent attention: the local heads' rows of the per-head projections, the latent's replicated.
      const int64_t qh = mla.qk_head_dim(), kvh = mla.qk_nope_head_dim + mla.v_head_dim, H = config.heads;
      const int64_t kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim;
      if (mla.q_lora_rank == 0) {
        expect_shape(store, name("wq"), {H * qh, d});
        lw.mla.wq = product_rows(name("wq"), hs.q0 * qh, hs.q1 * qh);
      } else {
        expect_shape(store, name("wq_a"), {mla.q_lora_rank, d});
        expect_shape(store, name("q_a_norm"), {mla.q_lora_rank});
        expect_shape(store, name("wq_b"), {H * qh, mla.q_lora_rank});
        lw.mla.wq_a = product_rows(name("wq_a"), 0, mla.q_lora_rank);
        lw.mla.q_a_norm = load_dense(store, name("q_a_norm"));
        lw.mla.wq_b = product_rows(name("wq_b"), hs.q0 * qh, hs.q1 * qh);
      }
      expect_shape(store, name("wkv_a"), {kv_a, d});
      expect_shape(store, name("kv_a_norm"), {mla.kv_lora_rank});
      expect_shape(store, name("wkv_b"), {H * kvh, mla.kv_lora_rank});
      expect_shape(store, name("wo"), {d, H * mla.v_head_dim});
      lw.mla.wkv_a = product_rows(name("wkv_a"), 0, kv_a);
      lw.mla.kv_a_norm = load_dense(store, name("kv_a_norm"));
      lw.mla.wkv_b = product_rows(name("wkv_b"), hs.q0 * kvh, hs.q1 * kvh);
      lw.mla.wo = product_weight(
          load_columns_as_stored(store, name("wo"), hs.q0 * mla.v_head_dim, hs.q1 * mla.v_head_dim));
    } else {
      expect_shape(store, name("wq"), {config.heads * hd, d});
      expect_shape(store, name("wk"), {config.kv_heads * hd, d});
      expect_shape(store, name("wv"), {config.kv_heads * hd, d});
      expect_shape(store, name("wo"), {d, config.heads * hd});
      // The projections are held in the checkpoint's dtype and multiplied as stored.
      lw.attn.wq = product_rows(name("wq"), hs.q0 * hd, hs.q1 * hd);
      lw.attn.wk = product_rows(name("wk"), hs.k0 * hd, hs.k1 * hd);
      lw.attn.wv = product_rows(name("wv"), hs.k0 * hd, hs.k1 * hd);
      lw.attn.wo = product_weight(load_columns_as_stored(store, name("wo"), hs.q0 * hd, hs.q1 * hd));
    }
    if (features.qkv_bias) {
      expect_shape(store, name("bq"), {config.heads * hd});
      expect_shape(store, name("bk"), {config.kv_heads * hd});
      expect_shape(store, name("bv"), {config.kv_heads * hd});
      lw.attn_options.bq = load_rows(store, name("bq"), hs.q0 * hd, hs.q1 * hd);
      lw.attn_options.bk = load_rows(store, name("bk"), hs.k0 * hd, hs.k1 * hd);
      lw.attn_options.bv = load_rows(store, name("bv"), hs.k0 * hd, hs.k1 * hd);
    }
    if (features.o_bias) {
      expect_shape(store, name("bo"), {d});
      if (info.tp_rank == 0) lw.attn_options.bo = load_dense(store, name("bo"));
    }
    if (features.attention_sinks) {
      expect_shape(store, name("sinks"), {config.heads});
      lw.attn_options.sinks = load_rows(store, name("sinks"), hs.q0, hs.q1);
    }
    lw.attn_options.window = features.window_of(l);
    lw.attn_options.qk_norm = features.qk_norm;
    lw.attn_options.qk_norm_eps = config.norm_eps;
    if (features.qk_norm == QkNorm::PerHead) {
      expect_shape(store, name("q_norm"), {hd});
      expect_shape(store, name("k_norm"), {hd});
      lw.attn_options.q_norm = load_dense(store, name("q_norm"));
      lw.attn_options.k_norm = load_dense(store, name("k_norm"));
    } else if (features.qk_norm == QkNorm::Projection) {
      // The gains of the local heads; the engine completes the sums of squares over the TP group.
      expect_shape(store, name("q_norm"), {config.heads * hd});
      expect_shape(store, name("k_norm"), {config.kv_heads * hd});
      lw.attn_options.q_norm = load_rows(store, name("q_norm"), hs.q0 * hd, hs.q1 * hd);
      lw.attn_options.k_norm = load_rows(store, name("k_norm"), hs.k0 * hd, hs.k1 * hd);
      lw.attn_options.q_norm_total = config.heads * hd;
      lw.attn_options.k_norm_total = config.kv_heads * hd;
    }
    if (features.is_dense_mlp(l)) {
      // A dense layer: its MLP sharded over TP like the shared expert; no router, no experts.
      load_tp_mlp(names.dense, l, features.dense_mlp_hidden, lw.dense_w1, lw.dense_w3, lw.dense_w2);
      load_progress().bytes += layer_bytes(lw);
      ++load_progress().parts;
      w.layers.push_back(std::move(lw));
      continue;
    }
    expect_shape(store, name("router"), {config.moe.router.num_experts, d});
    lw.router = load_dense(store, name("router"));  // replicated: the standard (non-EP) loader
    // Auxiliary-loss-free balancing's selection bias: there exactly when the model config says so.
    if (config.moe.use_score_bias) {
      expect_shape(store, name("score_bias"), {config.moe.router.num_experts});
      lw.score_bias = load_dense(store, name("score_bias"));
    } else {
      EXPAR_CHECK(!store.contains(name("score_bias")),
                  "checkpoint '{}' holds '{}' but its model config has no score bias: its manifest must say "
                  "\"score_bias\": true (write it again with expar train)",
                  store.label(), name("score_bias"));
    }
    if (features.router == RouterKind::BiasedTopkSoftmax) {
      expect_shape(store, name("router_bias"), {config.moe.router.num_experts});
      lw.router_bias = load_dense(store, name("router_bias"));
    }
    if (features.fused_experts) {
      // gpt-oss: the stacked experts, sliced by the same expert-parallel loader around a strided base loader.
      const std::string p = names.expert(l, 0, "");
      const int64_t h = config.moe.hidden_dim, e = config.moe.router.num_experts;
      expect_shape(store, p + "gate_up_proj", {e, d, 2 * h});
      expect_shape(store, p + "gate_up_proj_bias", {e, 2 * h});
      expect_shape(store, p + "down_proj", {e, h, d});
      expect_shape(store, p + "down_proj_bias", {e, d});
      // MXFP4 experts are held as stored where the shard covers whole blocks (else widened to f32).
      GptOssExperts g = load_gpt_oss_experts_as_stored(store, l, info.local_experts, i0, i1, i0 == 0);
      for (int e : info.local_experts)  // copied: their mapped pages go back
        for (const char* key : {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"})
          store.release_rows(p + key, e, e + 1);
      lw.experts = std::move(g.weights);
      lw.experts.b1 = std::move(g.b1);
      lw.experts.b3 = std::move(g.b3);
      lw.experts.b2 = std::move(g.b2);
    } else {
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
      // Held in the checkpoint's dtype (F32, BF16, F16) and multiplied as stored. Each expert's mapped pages
      // go back as soon as its piece is copied, so the file's pages and the copies do not both stay
      // resident. A dtype asked for converts each piece where that gives the stacked matrix's values
      // (BF16 elementwise; FP8 over whole 128-row blocks, which then never straddle two experts), so no
      // stack in the checkpoint's dtype is made beside the converted one.
      auto expert_matrix = [&](const char* key, const ExpertLoader& base) {
        const ExpertLoader piece = [&, key](int e) {
          Tensor t = base(e);
          const std::string n = names.expert(l, e, key);
          store.release_rows(n, 0, store.info(n).shape[0]);
          const bool whole_blocks = t.ndim() == 2 && t.dim(0) % kFp8Block == 0;
          if (weight_dtype == DType::BF16 || whole_blocks)
            return convert(std::move(t), MemCategory::ExpertWeights);
          return t;
        };
        return product_weight(expert_parallel_weight_loader(info.local_experts, piece));
      };
      lw.experts.w1 = expert_matrix("w1", rows_loader_as_stored(view("w1"), i0, i1));
      lw.experts.w3 = expert_matrix("w3", rows_loader_as_stored(view("w3"), i0, i1));
      lw.experts.w2 = expert_matrix("w2", columns_loader_as_stored(view("w2"), i0, i1));
      // FP8 experts stack only where their shards cover whole 128-row blocks, which gate/up and down may not
      // both do (shards of 64 rows of 128-wide experts): the three are held alike, so then all widen.
      if (lw.experts.w1.dtype() != lw.experts.w2.dtype() || lw.experts.w3.dtype() != lw.experts.w2.dtype())
        for (Tensor* m : {&lw.experts.w1, &lw.experts.w3, &lw.experts.w2})
          if (m->dtype() != DType::F32) *m = to_f32(*m, MemCategory::ExpertWeights);
    }
    lw.experts.activation = features.activation;
    lw.experts.validate();
    if (config.shared_expert_hidden > 0) {
      const int64_t h = config.shared_expert_hidden;
      if (load_tp_mlp(names.shared, l, h, lw.shared_w1, lw.shared_w3, lw.shared_w2)) {
        if (features.shared_expert_gate) {
          // The gate is a per-token scalar, so scaling each TP partial sum by it scales their sum.
          expect_shape(store, names.shared(l, "gate"), {1, d});
          lw.shared_gate = load_dense(store, names.shared(l, "gate"));
        }
      }
    }
    load_progress().bytes += layer_bytes(lw);
    ++load_progress().parts;
    w.layers.push_back(std::move(lw));
  }
  return w;
}

RankWeights load_rank_weights(const TensorStore& store, const ModelSpec& spec, const InferenceLayout& layout,
                              int rank, std::optional<DType> weight_dtype) {
  return load_rank_weights(store, weight_names(spec.format), spec.config, layout, rank, spec.features,
                           weight_dtype);
}

std::unique_ptr<TensorStore> open_store(const ModelSpec& spec) {
  if (spec.format == ModelFormat::Expar) return ExparCheckpointStore::open(spec.dir);
  return open_hf_store(spec.tensor_path, spec.format);
}

}  // namespace expar::infer
