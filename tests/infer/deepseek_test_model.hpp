#pragma once
// Small random DeepSeek-V3 and DeepSeek-V2 checkpoints in the Hugging Face tensor names with a config.json,
// and an independent dense reference of the architecture written from transformers' modeling_deepseek_v3.py /
// modeling_deepseek_v2.py and DeepSeek's published code: plain loops in double over the checkpoint's tensors,
// one sequence at a time, recomputing the whole prefix (no cache, no absorbed form, no parallelism).
//  - multi-head latent attention: q through q_a_proj -> RMSNorm -> q_b_proj (or a plain q_proj), the latent
//    and the shared rope key from kv_a_proj_with_mqa, RMSNorm, kv_b_proj into each head's key and value; rope
//    on adjacent pairs (2i, 2i + 1) of the rope parts; softmax scale (nope + rope)^-1/2 · mscale(factor,
//    mscale_all_dim)²; the two latent norms at eps 1e-6 whatever rms_norm_eps says;
//  - V3's router: sigmoid scores, selection on score + e_score_correction_bias, groups scored by the sum of
//    their best two, top-k of the best topk_group groups, weights the unbiased scores renormalised, times
//    routed_scaling_factor; V2's: softmax scores, greedy or group-limited (a group's best) top-k, times the
//    factor;
//  - ungated shared experts of n_shared_experts · moe_intermediate_size, and dense MLP layers (the first
//    first_k_dense_replace).
#include <cmath>
#include <functional>
#include <numeric>

#include "hf_test_models.hpp"

namespace expar::infer::testing {

struct DeepseekTestModel {
  bool v3 = true;
  int vocab = 64, layers = 3, first_dense = 1;
  int64_t d = 32, heads = 4, q_lora = 12, kv_lora = 16, nope = 6, rope_dim = 4, v_dim = 5;
  int64_t experts = 8, top_k = 3, n_group = 4, topk_group = 2, inter = 8, n_shared = 2, dense_inter = 24;
  int64_t max_seq = 32;
  double routed_scaling = 2.5, rope_theta = 10000.0;
  bool norm_topk_prob = true;
  std::string topk_method;  // "" : the family's (noaux_tc for V3, greedy for V2)
  float eps = 1e-5f;        // rms_norm_eps (the latent norms use 1e-6 regardless)
  // YaRN with DeepSeek's mscale keys: the rope's attention factor mscale(f, mscale) / mscale(f, all) and the
  // softmax scale's mscale(f, all)².
  double yarn_factor = 4.0, mscale = 1.0, mscale_all_dim = 0.8;
  int64_t original_max = 16;
  bool v5 = false;  // rope_parameters instead of rope_theta + rope_scaling
  std::map<std::string, Tensor> tensors;

  std::string layer(int l) const { return "model.layers." + std::to_string(l) + "."; }
  const float* w(const std::string& name) const { return tensors.at(name).data<float>(); }
  int64_t qk_dim() const { return nope + rope_dim; }
  bool dense_layer(int l) const { return l < first_dense; }
  std::string method() const { return !topk_method.empty() ? topk_method : v3 ? "noaux_tc" : "greedy"; }

  nlohmann::json rope_description() const {
    return {{"type", "yarn"},
            {"factor", yarn_factor},
            {"mscale", mscale},
            {"mscale_all_dim", mscale_all_dim},
            {"original_max_position_embeddings", original_max},
            {"beta_fast", 32},
            {"beta_slow", 1}};
  }

  nlohmann::json config() const {
    nlohmann::json j{{"model_type", v3 ? "deepseek_v3" : "deepseek_v2"},
                     {"vocab_size", vocab},
                     {"hidden_size", d},
                     {"num_hidden_layers", layers},
                     {"num_attention_heads", heads},
                     {"num_key_value_heads", heads},
                     {"max_position_embeddings", max_seq},
                     {"rms_norm_eps", eps},
                     {"q_lora_rank", q_lora > 0 ? nlohmann::json(q_lora) : nlohmann::json(nullptr)},
                     {"kv_lora_rank", kv_lora},
                     {"qk_nope_head_dim", nope},
                     {"qk_rope_head_dim", rope_dim},
                     {"v_head_dim", v_dim},
                     {"n_routed_experts", experts},
                     {"num_experts_per_tok", top_k},
                     {"n_group", n_group},
                     {"topk_group", topk_group},
                     {"topk_method", method()},
                     {"scoring_func", v3 ? "sigmoid" : "softmax"},
                     {"norm_topk_prob", norm_topk_prob},
                     {"routed_scaling_factor", routed_scaling},
                     {"moe_intermediate_size", inter},
                     {"n_shared_experts", n_shared},
                     {"intermediate_size", dense_inter},
                     {"first_k_dense_replace", first_dense},
                     {"moe_layer_freq", 1},
                     {"hidden_act", "silu"},
                     {"attention_bias", false},
                     {"tie_word_embeddings", false},
                     {"aux_loss_alpha", 0.001},
                     {"seq_aux", true}};
    if (v3) {
      j["rope_interleave"] = true;
      j["num_nextn_predict_layers"] = 1;
    }
    if (v5) {
      nlohmann::json p = rope_description();
      p["rope_type"] = p["type"];
      p.erase("type");
      p["rope_theta"] = rope_theta;
      j["rope_parameters"] = p;
    } else {
      j["rope_theta"] = rope_theta;
      j["rope_scaling"] = rope_description();
    }
    return j;
  }

  void randomize(uint64_t seed) {
    uint64_t stream = 0;
    auto normal = [&](Shape s, double stddev, float mean = 0.0f) {
      Tensor t = Tensor::empty(std::move(s));
      fill_normal(t, seed, ++stream, static_cast<float>(stddev));
      for (float& v : t.span<float>()) v += mean;
      return t;
    };
    auto inv_sqrt = [](int64_t n) { return 1.0 / std::sqrt(static_cast<double>(n)); };
    tensors.clear();
    tensors["model.embed_tokens.weight"] = normal({vocab, d}, 1.0);
    tensors["model.norm.weight"] = normal({d}, 0.1, 1.0f);
    tensors["lm_head.weight"] = normal({vocab, d}, inv_sqrt(d));
    for (int l = 0; l < layers; ++l) {
      const std::string p = layer(l), a = p + "self_attn.";
      tensors[p + "input_layernorm.weight"] = normal({d}, 0.1, 1.0f);
      tensors[p + "post_attention_layernorm.weight"] = normal({d}, 0.1, 1.0f);
      if (q_lora > 0) {
        tensors[a + "q_a_proj.weight"] = normal({q_lora, d}, inv_sqrt(d));
        tensors[a + "q_a_layernorm.weight"] = normal({q_lora}, 0.1, 1.0f);
        tensors[a + "q_b_proj.weight"] = normal({heads * qk_dim(), q_lora}, 2 * inv_sqrt(q_lora));
      } else {
        tensors[a + "q_proj.weight"] = normal({heads * qk_dim(), d}, 2 * inv_sqrt(d));
      }
      tensors[a + "kv_a_proj_with_mqa.weight"] = normal({kv_lora + rope_dim, d}, 2 * inv_sqrt(d));
      tensors[a + "kv_a_layernorm.weight"] = normal({kv_lora}, 0.1, 1.0f);
      tensors[a + "kv_b_proj.weight"] = normal({heads * (nope + v_dim), kv_lora}, inv_sqrt(kv_lora));
      tensors[a + "o_proj.weight"] = normal({d, heads * v_dim}, inv_sqrt(heads * v_dim));
      const std::string m = p + "mlp.";
      auto mlp = [&](const std::string& prefix, int64_t h) {
        tensors[prefix + "gate_proj.weight"] = normal({h, d}, inv_sqrt(d));
        tensors[prefix + "up_proj.weight"] = normal({h, d}, inv_sqrt(d));
        tensors[prefix + "down_proj.weight"] = normal({d, h}, inv_sqrt(h));
      };
      if (dense_layer(l)) {
        mlp(m, dense_inter);
        continue;
      }
      tensors[m + "gate.weight"] = normal({experts, d}, 2 * inv_sqrt(d));
      if (v3) tensors[m + "gate.e_score_correction_bias"] = normal({experts}, 0.3);
      for (int e = 0; e < experts; ++e) mlp(m + "experts." + std::to_string(e) + ".", inter);
      if (n_shared > 0) mlp(m + "shared_experts.", n_shared * inter);
    }
  }

  void write(const fs::path& dir, size_t shard_bytes = 64 * 1024) const {
    write_sharded_checkpoint(dir, tensors, shard_bytes);
    std::ofstream(dir / "config.json") << config().dump(2);
  }

  // ---- the dense reference ----

  using Vec = std::vector<double>;
  static Vec linear(const Vec& x, const float* w, int64_t in, int64_t out) {
    return HfTestModel::linear(x, w, nullptr, in, out);
  }
  // RMSNorm of each consecutive group of n values.
  static Vec norm(Vec x, int64_t n, const float* gain, double eps) {
    for (size_t g = 0; g < x.size() / static_cast<size_t>(n); ++g) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += x[g * n + i] * x[g * n + i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
      for (int64_t i = 0; i < n; ++i) x[g * n + i] *= inv * gain[i];
    }
    return x;
  }
  static double mscale_of(double factor, double m) {
    return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
  }
  double softmax_scale() const {
    const double m = mscale_of(yarn_factor, mscale_all_dim);
    return m * m / std::sqrt(static_cast<double>(qk_dim()));
  }
  // Rotates adjacent pairs of a rope part of rope_dim values at position `pos` (YaRN frequencies and scale).
  void rotate(double* x, int64_t pos) const {
    nn::RopeScaling s;
    s.type = nn::RopeType::Yarn;
    s.theta = rope_theta;
    s.factor = yarn_factor;
    s.original_max_position_embeddings = original_max;
    s.attention_factor = mscale_of(yarn_factor, mscale) / mscale_of(yarn_factor, mscale_all_dim);
    const nn::testing::ReferenceRope ref{s};
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const double angle = static_cast<double>(pos) * ref.frequency(i, rope_dim), sc = ref.scale();
      const double a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = sc * (a * std::cos(angle) - b * std::sin(angle));
      x[2 * i + 1] = sc * (b * std::cos(angle) + a * std::sin(angle));
    }
  }

  Vec attention(int l, const Vec& x) const {
    const std::string a = layer(l) + "self_attn.";
    const int64_t n = static_cast<int64_t>(x.size()) / d, qd = heads * qk_dim();
    const Vec q = q_lora > 0 ? linear(norm(linear(x, w(a + "q_a_proj.weight"), d, q_lora), q_lora,
                                           w(a + "q_a_layernorm.weight"), 1e-6),
                                      w(a + "q_b_proj.weight"), q_lora, qd)
                             : linear(x, w(a + "q_proj.weight"), d, qd);
    const Vec kv_a = linear(x, w(a + "kv_a_proj_with_mqa.weight"), d, kv_lora + rope_dim);
    Vec latent(static_cast<size_t>(n * kv_lora)), k_rope(static_cast<size_t>(n * rope_dim));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < kv_lora; ++i) latent[t * kv_lora + i] = kv_a[t * (kv_lora + rope_dim) + i];
      for (int64_t i = 0; i < rope_dim; ++i)
        k_rope[t * rope_dim + i] = kv_a[t * (kv_lora + rope_dim) + kv_lora + i];
      rotate(&k_rope[t * rope_dim], t);
    }
    const Vec kv = linear(norm(latent, kv_lora, w(a + "kv_a_layernorm.weight"), 1e-6),
                          w(a + "kv_b_proj.weight"), kv_lora, heads * (nope + v_dim));
    Vec ctx(static_cast<size_t>(n * heads * v_dim), 0.0);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        Vec qi(q.begin() + i * qd + h * qk_dim(), q.begin() + i * qd + (h + 1) * qk_dim());
        rotate(qi.data() + nope, i);
        Vec s(static_cast<size_t>(i + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k_nope = &kv[(j * heads + h) * (nope + v_dim)];
          double dot = 0;
          for (int64_t e = 0; e < nope; ++e) dot += qi[e] * k_nope[e];
          for (int64_t e = 0; e < rope_dim; ++e) dot += qi[nope + e] * k_rope[j * rope_dim + e];
          s[j] = dot * softmax_scale();
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < v_dim; ++e)
            ctx[(i * heads + h) * v_dim + e] += s[j] / sum * kv[(j * heads + h) * (nope + v_dim) + nope + e];
      }
    return linear(ctx, w(a + "o_proj.weight"), heads * v_dim, d);
  }

  // silu(x·gateᵀ) ⊙ x·upᵀ, then ·downᵀ, of one token.
  Vec mlp(const std::string& prefix, const Vec& xt, int64_t h) const {
    Vec g = linear(xt, w(prefix + "gate_proj.weight"), d, h),
        u = linear(xt, w(prefix + "up_proj.weight"), d, h);
    for (int64_t i = 0; i < h; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return linear(g, w(prefix + "down_proj.weight"), h, d);
  }

  // The k best of `score` among `eligible` experts, best first, ties to the lower index.
  std::vector<int> best(const Vec& score, const std::vector<bool>& eligible, int64_t k) const {
    std::vector<int> order;
    for (int e = 0; e < experts; ++e)
      if (eligible[e]) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    order.resize(static_cast<size_t>(k));
    return order;
  }

  Vec moe(int l, const Vec& x) const {
    const std::string m = layer(l) + "mlp.";
    const int64_t n = static_cast<int64_t>(x.size()) / d;
    Vec y(x.size(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const Vec xt(x.begin() + t * d, x.begin() + (t + 1) * d);
      if (dense_layer(l)) {
        const Vec o = mlp(m, xt, dense_inter);
        for (int64_t c = 0; c < d; ++c) y[t * d + c] = o[c];
        continue;
      }
      Vec logits = linear(xt, w(m + "gate.weight"), d, experts), score(logits.size()), choice;
      if (v3) {
        for (int e = 0; e < experts; ++e) score[e] = 1.0 / (1.0 + std::exp(-logits[e]));
        choice = score;
        for (int e = 0; e < experts; ++e) choice[e] += w(m + "gate.e_score_correction_bias")[e];
      } else {
        const double mx = *std::max_element(logits.begin(), logits.end());
        double z = 0;
        for (int e = 0; e < experts; ++e) z += (score[e] = std::exp(logits[e] - mx));
        for (double& s : score) s /= z;
        choice = score;
      }
      std::vector<bool> eligible(static_cast<size_t>(experts), true);
      if (method() != "greedy") {
        const int64_t size = experts / n_group;
        Vec group(static_cast<size_t>(n_group));
        for (int64_t g = 0; g < n_group; ++g) {
          Vec members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
          std::sort(members.begin(), members.end(), std::greater<>());
          group[g] = v3 ? members[0] + (size > 1 ? members[1] : 0.0) : members[0];
        }
        std::vector<int> groups(static_cast<size_t>(n_group));
        std::iota(groups.begin(), groups.end(), 0);
        std::stable_sort(groups.begin(), groups.end(), [&](int a, int b) { return group[a] > group[b]; });
        std::fill(eligible.begin(), eligible.end(), false);
        for (int64_t i = 0; i < topk_group; ++i)
          for (int64_t e = groups[i] * size; e < (groups[i] + 1) * size; ++e) eligible[e] = true;
      }
      const std::vector<int> chosen = best(choice, eligible, top_k);
      double kept = 0;
      for (int e : chosen) kept += score[e];
      for (int e : chosen) {
        const double weight = (norm_topk_prob ? score[e] / kept : score[e]) * routed_scaling;
        const Vec o = mlp(m + "experts." + std::to_string(e) + ".", xt, inter);
        for (int64_t c = 0; c < d; ++c) y[t * d + c] += weight * o[c];
      }
      if (n_shared > 0) {
        const Vec o = mlp(m + "shared_experts.", xt, n_shared * inter);
        for (int64_t c = 0; c < d; ++c) y[t * d + c] += o[c];
      }
    }
    return y;
  }

  // Logits [tokens, vocab] of one sequence.
  Tensor dense_logits(const std::vector<int32_t>& tokens) const {
    const auto n = static_cast<int64_t>(tokens.size());
    Vec h(static_cast<size_t>(n * d));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < d; ++c) h[t * d + c] = w("model.embed_tokens.weight")[tokens[t] * d + c];
    for (int l = 0; l < layers; ++l) {
      const Vec a = attention(l, norm(h, d, w(layer(l) + "input_layernorm.weight"), eps));
      for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
      const Vec m = moe(l, norm(h, d, w(layer(l) + "post_attention_layernorm.weight"), eps));
      for (size_t i = 0; i < h.size(); ++i) h[i] += m[i];
    }
    const Vec logits = linear(norm(h, d, w("model.norm.weight"), eps), w("lm_head.weight"), d, vocab);
    Tensor out = Tensor::empty({n, static_cast<int64_t>(vocab)});
    for (size_t i = 0; i < logits.size(); ++i) out.data<float>()[i] = static_cast<float>(logits[i]);
    return out;
  }
};

// DeepSeek-V3: q LoRA, sigmoid grouped router with a correction bias, renormalised and scaled; a dense first
// layer; two shared experts.
inline DeepseekTestModel deepseek_v3_test_model() {
  DeepseekTestModel m;
  m.randomize(71);
  return m;
}

// DeepSeek-V2(-Lite): a plain q projection, softmax router (greedy by default), not renormalised, scaled.
inline DeepseekTestModel deepseek_v2_test_model(const std::string& topk_method = "greedy") {
  DeepseekTestModel m;
  m.v3 = false;
  m.q_lora = 0;
  m.norm_topk_prob = false;
  m.routed_scaling = 1.5;
  m.topk_method = topk_method;
  m.randomize(73);
  return m;
}

}  // namespace expar::infer::testing
