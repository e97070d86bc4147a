#pragma once
// Small random Hugging Face Qwen-MoE, Qwen3-MoE (also with tied embeddings), OLMoE and gpt-oss (also MXFP4)
// checkpoints, written in their tensor names with a config.json, and an independent dense reference of these
// architectures: plain loops in double over the Hugging Face tensors, one sequence at a time, recomputing the
// whole prefix (no cache, no parallelism).
// Each model carries the rope it expects (`rope`, checked by nn/rope_reference.hpp's formulas) and writes it
// in the v4 (rope_theta + rope_scaling) or v5 (rope_parameters) layout, or leaves it to the family default.
#include <cmath>
#include <numeric>

#include "expar/core/convert.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "infer_test_util.hpp"
#include "nn/rope_reference.hpp"

namespace expar::infer::testing {

struct HfTestModel {
  ModelFormat format = ModelFormat::QwenMoe;
  int vocab = 64, layers = 2;
  int64_t d = 40, heads = 12, kv_heads = 12, head_dim = 8, experts = 24, top_k = 4, inter = 12, shared = 18,
          max_seq = 32;
  bool norm_topk_prob = false;  // Qwen
  int64_t window = 3;           // gpt-oss sliding_attention layers (layer 0 of 2)
  int64_t mixtral_window = 0;   // Mixtral sliding_window on every layer; 0: null (full attention)
  // Qwen-MoE use_sliding_window: sliding_window on the even layers below max_window_layers (Qwen2MoeConfig)
  bool qwen_sliding = false;
  int64_t qwen_window = 3, max_window_layers = 28;
  double rope_theta = 1e6;
  float eps = 1e-6f;
  bool attention_bias = false;  // Qwen3-MoE / OLMoE: q/k/v/o biases
  bool tied = false;            // tie_word_embeddings: no lm_head.weight, the LM head is the embedding
  // Qwen-MoE dense MLP layers: those listed in mlp_only_layers, and those with (l + 1) % sparse_step != 0.
  std::vector<int> mlp_only_layers;
  int64_t sparse_step = 1, dense_inter = 20;
  bool dense_layer(int l) const {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) != mlp_only_layers.end() ||
           (l + 1) % sparse_step != 0;
  }
  // The rope the reference applies (its theta is rope_theta) and how config.json states it:
  // rope_json null: v4 "rope_theta" only (gpt-oss: nothing, the family's YaRN default); otherwise the
  // description, under "rope_parameters" (with rope_theta inside) when v5, else under "rope_scaling".
  nn::RopeScaling rope;
  nlohmann::json rope_json;
  bool v5 = false;
  std::map<std::string, Tensor> tensors;
  mutable int64_t clamp_hits = 0;  // gpt-oss activations the dense reference clamped (gate > 7 or |up| > 7)

  std::string layer(int l) const { return "model.layers." + std::to_string(l) + "."; }
  // The router and expert e's gate (0), up (1) and down (2) projections of layer l (not gpt-oss's).
  std::string router_name(int l) const {
    return layer(l) + (format == ModelFormat::Mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
  }
  std::string expert_name(int l, int e, int which) const {
    if (format == ModelFormat::Mixtral)
      return layer(l) + "block_sparse_moe.experts." + std::to_string(e) + "." +
             (which == 0   ? "w1"
              : which == 1 ? "w3"
                           : "w2") +
             ".weight";
    return layer(l) + "mlp.experts." + std::to_string(e) + "." +
           (which == 0   ? "gate_proj"
            : which == 1 ? "up_proj"
                         : "down_proj") +
           ".weight";
  }
  bool qkv_bias() const {
    return format == ModelFormat::QwenMoe || format == ModelFormat::GptOss || attention_bias;
  }
  bool o_bias() const { return format == ModelFormat::GptOss || attention_bias; }
  const float* w_or_null(const std::string& name) const {
    return tensors.count(name) ? tensors.at(name).data<float>() : nullptr;
  }
  const float* w(const std::string& name) const { return tensors.at(name).data<float>(); }

  nlohmann::json config() const {
    nlohmann::json j{{"vocab_size", vocab},
                     {"hidden_size", d},
                     {"num_hidden_layers", layers},
                     {"num_attention_heads", heads},
                     {"num_key_value_heads", kv_heads},
                     {"max_position_embeddings", max_seq},
                     {"rms_norm_eps", eps},
                     {"num_experts_per_tok", top_k},
                     {"tie_word_embeddings", tied}};
    if (v5) {
      // gpt-oss with no rope: its YaRN default written out (v5 has no top-level rope_theta to carry theta)
      nlohmann::json p =
          !rope_json.is_null() ? rope_json
          : format == ModelFormat::GptOss
              ? nlohmann::json{{"rope_type", "yarn"}, {"factor", 32.0},
                               {"beta_fast", 32.0},   {"beta_slow", 1.0},
                               {"truncate", false},   {"original_max_position_embeddings", 4096}}
              : nlohmann::json{{"rope_type", "default"}};
      p["rope_theta"] = rope_theta;
      j["rope_parameters"] = p;
    } else {
      j["rope_theta"] = rope_theta;
      if (!rope_json.is_null()) j["rope_scaling"] = rope_json;
    }
    if (format == ModelFormat::QwenMoe) {
      j["model_type"] = "qwen2_moe";
      j["num_experts"] = experts;
      j["moe_intermediate_size"] = inter;
      j["shared_expert_intermediate_size"] = shared;
      j["intermediate_size"] = dense_inter;  // the dense layers' MLP
      j["norm_topk_prob"] = norm_topk_prob;
      j["decoder_sparse_step"] = sparse_step;
      j["mlp_only_layers"] = mlp_only_layers;
      j["use_sliding_window"] = qwen_sliding;
      if (qwen_sliding) {
        j["sliding_window"] = qwen_window;
        j["max_window_layers"] = max_window_layers;
      }
    } else if (format == ModelFormat::Mixtral) {
      j["model_type"] = "mixtral";
      j["head_dim"] = head_dim;
      j["num_local_experts"] = experts;
      j["intermediate_size"] = inter;
      j["sliding_window"] = mixtral_window > 0 ? nlohmann::json(mixtral_window) : nlohmann::json(nullptr);
    } else if (format == ModelFormat::Qwen3Moe || format == ModelFormat::Olmoe) {
      j["model_type"] = format == ModelFormat::Qwen3Moe ? "qwen3_moe" : "olmoe";
      j["num_experts"] = experts;
      j[format == ModelFormat::Qwen3Moe ? "moe_intermediate_size" : "intermediate_size"] = inter;
      j["norm_topk_prob"] = norm_topk_prob;
      j["attention_bias"] = attention_bias;
      if (format == ModelFormat::Qwen3Moe) {
        j["head_dim"] = head_dim;
        j["decoder_sparse_step"] = sparse_step;
        j["mlp_only_layers"] = mlp_only_layers;
        j["intermediate_size"] = dense_inter;
        j["use_sliding_window"] = false;
      } else {
        j["clip_qkv"] = nullptr;
      }
    } else {
      j["model_type"] = "gpt_oss";
      j["head_dim"] = head_dim;
      j["num_local_experts"] = experts;
      j["intermediate_size"] = inter;
      j["sliding_window"] = window;
      j["attention_bias"] = true;
      j["swiglu_limit"] = 7.0;
      std::vector<std::string> types;
      for (int l = 0; l < layers; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
    return j;
  }

  // Random weights with the format's names. Larger gate/up weights in gpt-oss push some activations past the
  // clamp at 7, so the clamp is exercised.
  void randomize(uint64_t seed) {
    uint64_t stream = 0;
    auto normal = [&](Shape s, float stddev, float mean = 0.0f) {
      Tensor t = Tensor::empty(std::move(s));
      fill_normal(t, seed, ++stream, stddev);
      for (float& v : t.span<float>()) v += mean;
      return t;
    };
    const float in = 1.0f / std::sqrt(static_cast<float>(d));
    const int64_t qd = heads * head_dim, kd = kv_heads * head_dim;
    tensors["model.embed_tokens.weight"] = normal({vocab, d}, 1.0f);
    tensors["model.norm.weight"] = normal({d}, 0.1f, 1.0f);
    if (!tied) tensors["lm_head.weight"] = normal({vocab, d}, in);
    for (int l = 0; l < layers; ++l) {
      const std::string p = layer(l);
      tensors[p + "input_layernorm.weight"] = normal({d}, 0.1f, 1.0f);
      tensors[p + "post_attention_layernorm.weight"] = normal({d}, 0.1f, 1.0f);
      tensors[p + "self_attn.q_proj.weight"] = normal({qd, d}, 2 * in);
      tensors[p + "self_attn.k_proj.weight"] = normal({kd, d}, 2 * in);
      tensors[p + "self_attn.v_proj.weight"] = normal({kd, d}, in);
      tensors[p + "self_attn.o_proj.weight"] = normal({d, qd}, 1.0f / std::sqrt(static_cast<float>(qd)));
      if (qkv_bias()) {
        tensors[p + "self_attn.q_proj.bias"] = normal({qd}, 0.5f);
        tensors[p + "self_attn.k_proj.bias"] = normal({kd}, 0.5f);
        tensors[p + "self_attn.v_proj.bias"] = normal({kd}, 0.5f);
      }
      if (o_bias()) tensors[p + "self_attn.o_proj.bias"] = normal({d}, 0.5f);
      if (format == ModelFormat::Qwen3Moe) {
        tensors[p + "self_attn.q_norm.weight"] = normal({head_dim}, 0.3f, 1.0f);
        tensors[p + "self_attn.k_norm.weight"] = normal({head_dim}, 0.3f, 1.0f);
      }
      if (format == ModelFormat::Olmoe) {
        tensors[p + "self_attn.q_norm.weight"] = normal({qd}, 0.3f, 1.0f);
        tensors[p + "self_attn.k_norm.weight"] = normal({kd}, 0.3f, 1.0f);
      }
      if (dense_layer(l)) {
        tensors[p + "mlp.gate_proj.weight"] = normal({dense_inter, d}, in);
        tensors[p + "mlp.up_proj.weight"] = normal({dense_inter, d}, in);
        tensors[p + "mlp.down_proj.weight"] = normal({d, dense_inter}, 1.0f / std::sqrt(float(dense_inter)));
        continue;
      }
      if (format != ModelFormat::GptOss) {
        tensors[router_name(l)] = normal({experts, d}, in);
        for (int e = 0; e < experts; ++e) {
          tensors[expert_name(l, e, 0)] = normal({inter, d}, in);
          tensors[expert_name(l, e, 1)] = normal({inter, d}, in);
          tensors[expert_name(l, e, 2)] = normal({d, inter}, 1.0f / std::sqrt(static_cast<float>(inter)));
        }
        if (format != ModelFormat::QwenMoe) continue;
        tensors[p + "mlp.shared_expert.gate_proj.weight"] = normal({shared, d}, in);
        tensors[p + "mlp.shared_expert.up_proj.weight"] = normal({shared, d}, in);
        tensors[p + "mlp.shared_expert.down_proj.weight"] =
            normal({d, shared}, 1.0f / std::sqrt(static_cast<float>(shared)));
        tensors[p + "mlp.shared_expert_gate.weight"] = normal({1, d}, in);
      } else {
        tensors[p + "self_attn.sinks"] = normal({heads}, 1.0f);
        tensors[p + "mlp.router.weight"] = normal({experts, d}, in);
        tensors[p + "mlp.router.bias"] = normal({experts}, 0.5f);
        tensors[p + "mlp.experts.gate_up_proj"] = normal({experts, d, 2 * inter}, 4 * in);
        tensors[p + "mlp.experts.gate_up_proj_bias"] = normal({experts, 2 * inter}, 0.5f);
        tensors[p + "mlp.experts.down_proj"] = normal({experts, inter, d}, 0.1f);
        tensors[p + "mlp.experts.down_proj_bias"] = normal({experts, d}, 0.5f);
      }
    }
  }

  // Sharded safetensors (with model.safetensors.index.json) and config.json.
  void write(const fs::path& dir, size_t shard_bytes = 64 * 1024) const {
    write_sharded_checkpoint(dir, tensors, shard_bytes);
    std::ofstream(dir / "config.json") << config().dump(2);
  }

  // ---- the dense reference ----

  std::vector<double> rmsnorm(const std::vector<double>& x, const std::string& gain) const {
    std::vector<double> y(x.size());
    const int64_t n = static_cast<int64_t>(x.size()) / d;
    for (int64_t t = 0; t < n; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i)
        ss += x[static_cast<size_t>(t * d + i)] * x[static_cast<size_t>(t * d + i)];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
      for (int64_t i = 0; i < d; ++i)
        y[static_cast<size_t>(t * d + i)] = x[static_cast<size_t>(t * d + i)] * inv * w(gain)[i];
    }
    return y;
  }

  // y [n, out] = x [n, in] · Wᵀ (+ b), W [out, in] row-major.
  static std::vector<double> linear(const std::vector<double>& x, const float* wt, const float* b, int64_t in,
                                    int64_t out) {
    const int64_t n = static_cast<int64_t>(x.size()) / in;
    std::vector<double> y(static_cast<size_t>(n * out));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b ? b[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += x[static_cast<size_t>(t * in + i)] * wt[o * in + i];
        y[static_cast<size_t>(t * out + o)] = acc;
      }
    return y;
  }

  void apply_rope(std::vector<double>& x, int64_t n_heads) const {
    const int64_t n = static_cast<int64_t>(x.size()) / (n_heads * head_dim), half = head_dim / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          nn::RopeScaling sc = rope;
          sc.theta = rope_theta;
          const nn::testing::ReferenceRope ref{sc};
          const double angle = static_cast<double>(t) * ref.frequency(i, head_dim), s = ref.scale();
          double& a = x[static_cast<size_t>((t * n_heads + h) * head_dim + i)];
          double& b = x[static_cast<size_t>((t * n_heads + h) * head_dim + i + half)];
          const double a0 = a, b0 = b;
          a = s * (a0 * std::cos(angle) - b0 * std::sin(angle));
          b = s * (b0 * std::cos(angle) + a0 * std::sin(angle));
        }
  }

  std::vector<double> attention(int l, const std::vector<double>& x) const {
    const std::string p = layer(l) + "self_attn.";
    const bool gpt = format == ModelFormat::GptOss;
    const int64_t n = static_cast<int64_t>(x.size()) / d, qd = heads * head_dim, kd = kv_heads * head_dim;
    auto q = linear(x, w(p + "q_proj.weight"), w_or_null(p + "q_proj.bias"), d, qd);
    auto k = linear(x, w(p + "k_proj.weight"), w_or_null(p + "k_proj.bias"), d, kd);
    auto v = linear(x, w(p + "v_proj.weight"), w_or_null(p + "v_proj.bias"), d, kd);
    if (format == ModelFormat::Qwen3Moe) {  // RMSNorm over each head
      q = group_rmsnorm(q, head_dim, w(p + "q_norm.weight"));
      k = group_rmsnorm(k, head_dim, w(p + "k_norm.weight"));
    }
    if (format == ModelFormat::Olmoe) {  // RMSNorm over the whole projection
      q = group_rmsnorm(q, qd, w(p + "q_norm.weight"));
      k = group_rmsnorm(k, kd, w(p + "k_norm.weight"));
    }
    apply_rope(q, heads);
    apply_rope(k, kv_heads);
    const bool qwen_slides =
        format == ModelFormat::QwenMoe && qwen_sliding && l % 2 == 0 && l < max_window_layers;
    const int64_t win = gpt                              ? (l % 2 == 0 ? window : 0)
                        : format == ModelFormat::Mixtral ? mixtral_window
                        : qwen_slides                    ? qwen_window
                                                         : 0;
    std::vector<double> ctx(static_cast<size_t>(n * qd), 0.0);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv_heads);
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> s(static_cast<size_t>(n), -INFINITY);
        double max = gpt ? w(p + "sinks")[h] : -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          if (win > 0 && i - j >= win) continue;
          double dot = 0;
          for (int64_t e = 0; e < head_dim; ++e)
            dot += q[static_cast<size_t>(i * qd + h * head_dim + e)] *
                   k[static_cast<size_t>(j * kd + g * head_dim + e)];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(head_dim));
          max = std::max(max, s[static_cast<size_t>(j)]);
        }
        double sum = gpt ? std::exp(w(p + "sinks")[h] - max) : 0.0;  // the sink: mass without a value
        for (double& sj : s) sum += (sj = std::exp(sj - max));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < head_dim; ++e)
            ctx[static_cast<size_t>(i * qd + h * head_dim + e)] +=
                s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j * kd + g * head_dim + e)];
      }
    }
    return linear(ctx, w(p + "o_proj.weight"), w_or_null(p + "o_proj.bias"), qd, d);
  }

  // RMSNorm of each consecutive group of n values of x; the gain has n values (whole: one group per row).
  std::vector<double> group_rmsnorm(std::vector<double> x, int64_t n, const float* gain) const {
    for (size_t g = 0; g < x.size() / static_cast<size_t>(n); ++g) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i)
        ss += x[g * static_cast<size_t>(n) + static_cast<size_t>(i)] *
              x[g * static_cast<size_t>(n) + static_cast<size_t>(i)];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
      for (int64_t i = 0; i < n; ++i) x[g * static_cast<size_t>(n) + static_cast<size_t>(i)] *= inv * gain[i];
    }
    return x;
  }

  static double silu(double v) { return v / (1.0 + std::exp(-v)); }

  // The k largest of row (ties to the lower index), descending.
  std::vector<int> top(const std::vector<double>& row) const {
    std::vector<int> order(row.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)]; });
    order.resize(static_cast<size_t>(top_k));
    return order;
  }

  std::vector<double> moe(int l, const std::vector<double>& x) const {
    const std::string p = layer(l) + "mlp.";
    const int64_t n = static_cast<int64_t>(x.size()) / d;
    std::vector<double> y(x.size(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> xt(x.begin() + t * d, x.begin() + (t + 1) * d);
      double* yt = y.data() + t * d;
      if (dense_layer(l)) {  // Qwen2MoeMLP of intermediate_size
        auto g = linear(xt, w(p + "gate_proj.weight"), nullptr, d, dense_inter);
        auto u = linear(xt, w(p + "up_proj.weight"), nullptr, d, dense_inter);
        for (int64_t i = 0; i < dense_inter; ++i)
          g[static_cast<size_t>(i)] = silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
        auto o = linear(g, w(p + "down_proj.weight"), nullptr, dense_inter, d);
        for (int64_t c = 0; c < d; ++c) yt[c] = o[static_cast<size_t>(c)];
        continue;
      }
      if (format != ModelFormat::GptOss) {
        auto logits = linear(xt, w(router_name(l)), nullptr, d, experts);
        const double mx = *std::max_element(logits.begin(), logits.end());
        double z = 0;
        for (double& v : logits) z += (v = std::exp(v - mx));
        for (double& v : logits) v /= z;  // softmax over all experts
        const auto chosen = top(logits);
        double kept = 0;
        for (int e : chosen) kept += logits[static_cast<size_t>(e)];
        for (int e : chosen) {
          const bool renormalize = norm_topk_prob || format == ModelFormat::Mixtral;
          const double wt = logits[static_cast<size_t>(e)] / (renormalize ? kept : 1.0);
          auto g = linear(xt, w(expert_name(l, e, 0)), nullptr, d, inter);
          auto u = linear(xt, w(expert_name(l, e, 1)), nullptr, d, inter);
          for (int64_t i = 0; i < inter; ++i)
            g[static_cast<size_t>(i)] = silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
          auto o = linear(g, w(expert_name(l, e, 2)), nullptr, inter, d);
          for (int64_t c = 0; c < d; ++c) yt[c] += wt * o[static_cast<size_t>(c)];
        }
        if (format != ModelFormat::QwenMoe) continue;
        auto g = linear(xt, w(p + "shared_expert.gate_proj.weight"), nullptr, d, shared);
        auto u = linear(xt, w(p + "shared_expert.up_proj.weight"), nullptr, d, shared);
        for (int64_t i = 0; i < shared; ++i)
          g[static_cast<size_t>(i)] = silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
        auto o = linear(g, w(p + "shared_expert.down_proj.weight"), nullptr, shared, d);
        const double gate = linear(xt, w(p + "shared_expert_gate.weight"), nullptr, d, 1)[0];
        for (int64_t c = 0; c < d; ++c) yt[c] += o[static_cast<size_t>(c)] / (1.0 + std::exp(-gate));
      } else {
        auto logits = linear(xt, w(p + "router.weight"), w(p + "router.bias"), d, experts);
        const auto chosen = top(logits);
        const double mx = logits[static_cast<size_t>(chosen[0])];
        double z = 0;
        for (int e : chosen) z += std::exp(logits[static_cast<size_t>(e)] - mx);  // softmax over the top k
        const float* gu = w(p + "experts.gate_up_proj");
        const float* gub = w(p + "experts.gate_up_proj_bias");
        const float* dn = w(p + "experts.down_proj");
        const float* dnb = w(p + "experts.down_proj_bias");
        for (int e : chosen) {
          const double wt = std::exp(logits[static_cast<size_t>(e)] - mx) / z;
          std::vector<double> act(static_cast<size_t>(inter));
          for (int64_t i = 0; i < inter; ++i) {
            double g = gub[e * 2 * inter + 2 * i], u = gub[e * 2 * inter + 2 * i + 1];
            for (int64_t c = 0; c < d; ++c) {
              g += xt[static_cast<size_t>(c)] * gu[(e * d + c) * 2 * inter + 2 * i];
              u += xt[static_cast<size_t>(c)] * gu[(e * d + c) * 2 * inter + 2 * i + 1];
            }
            clamp_hits += g > 7.0 || std::fabs(u) > 7.0;
            g = std::min(g, 7.0);
            u = std::clamp(u, -7.0, 7.0);
            act[static_cast<size_t>(i)] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
          }
          for (int64_t c = 0; c < d; ++c) {
            double o = dnb[e * d + c];
            for (int64_t i = 0; i < inter; ++i)
              o += act[static_cast<size_t>(i)] * dn[(e * inter + i) * d + c];
            yt[c] += wt * o;
          }
        }
      }
    }
    return y;
  }

  // Logits [tokens, vocab] of one sequence.
  Tensor dense_logits(const std::vector<int32_t>& tokens) const {
    const auto n = static_cast<int64_t>(tokens.size());
    std::vector<double> h(static_cast<size_t>(n * d));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < d; ++c)
        h[static_cast<size_t>(t * d + c)] =
            w("model.embed_tokens.weight")[tokens[static_cast<size_t>(t)] * d + c];
    for (int l = 0; l < layers; ++l) {
      const auto a = attention(l, rmsnorm(h, layer(l) + "input_layernorm.weight"));
      for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
      const auto m = moe(l, rmsnorm(h, layer(l) + "post_attention_layernorm.weight"));
      for (size_t i = 0; i < h.size(); ++i) h[i] += m[i];
    }
    const auto logits = linear(rmsnorm(h, "model.norm.weight"),
                               w(tied ? "model.embed_tokens.weight" : "lm_head.weight"), nullptr, d, vocab);
    Tensor out = Tensor::empty({n, static_cast<int64_t>(vocab)});
    for (size_t i = 0; i < logits.size(); ++i) out.data<float>()[i] = static_cast<float>(logits[i]);
    return out;
  }
};

inline HfTestModel qwen_test_model(bool norm_topk_prob = false) {
  HfTestModel m;
  m.format = ModelFormat::QwenMoe;
  m.d = 48;  // Qwen's config has no head_dim: it is hidden_size / heads
  m.head_dim = 4;
  m.norm_topk_prob = norm_topk_prob;
  m.randomize(31);
  return m;
}

// Grouped-query attention with one key/value head (replicated on every TP rank). No rope in config.json: the
// family's default YaRN (factor 32 over 4096 positions, beta 32/1, truncate false) applies. d and inter
// multiples of 32 allow MXFP4 experts.
inline HfTestModel gpt_oss_test_model(int64_t d = 40, int64_t inter = 12) {
  HfTestModel m;
  m.format = ModelFormat::GptOss;
  m.d = d;
  m.inter = inter;
  m.kv_heads = 1;
  m.rope_theta = 150000.0;
  m.eps = 1e-5f;
  m.rope.type = nn::RopeType::Yarn;
  m.rope.factor = 32.0;
  m.rope.original_max_position_embeddings = 4096;
  m.rope.truncate = false;
  m.randomize(47);
  return m;
}

// Qwen3-MoE: per-head q/k norms, q/k/v/o biases, head_dim given (not hidden / heads), norm_topk_prob, and a
// linear rope in the v5 layout.
inline HfTestModel qwen3_moe_test_model() {
  HfTestModel m;
  m.format = ModelFormat::Qwen3Moe;
  m.shared = 0;
  m.norm_topk_prob = true;
  m.attention_bias = true;
  m.v5 = true;
  m.rope.type = nn::RopeType::Linear;
  m.rope.factor = 2.0;
  m.rope_json = {{"rope_type", "linear"}, {"factor", 2.0}};
  m.randomize(53);
  return m;
}

// OLMoE: q/k norms over the whole projections, one key/value head, no biases, head_dim = hidden / heads, a
// llama3 rope in the v4 layout (rope_scaling).
inline HfTestModel olmoe_test_model() {
  HfTestModel m;
  m.format = ModelFormat::Olmoe;
  m.kv_heads = 1;  // replicated over TP: the k norm's sums of squares count it once
  m.d = 48;
  m.head_dim = 4;
  m.shared = 0;
  m.eps = 1e-5f;
  m.rope_theta = 10000.0;
  m.rope.type = nn::RopeType::Llama3;
  m.rope.factor = 8.0;
  m.rope.original_max_position_embeddings = 64;
  m.rope.low_freq_factor = 1.0;
  m.rope.high_freq_factor = 4.0;
  m.rope_json = {{"rope_type", "llama3"},
                 {"factor", 8.0},
                 {"original_max_position_embeddings", 64},
                 {"low_freq_factor", 1.0},
                 {"high_freq_factor", 4.0}};
  m.randomize(59);
  return m;
}

// Mixtral with a sliding window of 3 on every layer.
inline HfTestModel mixtral_test_model() {
  HfTestModel m;
  m.format = ModelFormat::Mixtral;
  m.shared = 0;
  m.eps = 1e-5f;
  m.mixtral_window = 3;
  m.randomize(61);
  return m;
}

// Qwen3-MoE with tie_word_embeddings true: the embedding is the LM head (no lm_head.weight stored).
inline HfTestModel tied_qwen3_moe_test_model() {
  HfTestModel m = qwen3_moe_test_model();
  m.tied = true;
  m.tensors.clear();
  m.randomize(67);
  return m;
}

// Quantised form of one stacked matrix [E, in, out]: blocks U8 [E, out, in/32, 16], scales U8 [E, out,
// in/32], random; `dense` receives the [E, in, out] values they encode (decoded with a table of its own).
struct Quantised {
  Tensor blocks, scales, dense;
};

inline Quantised random_mxfp4(int64_t experts, int64_t in, int64_t out, uint64_t stream) {
  static const float kTable[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t groups = in / 32;
  Quantised q;
  q.blocks = Tensor::empty({experts, out, groups, 16}, DType::U8);
  q.scales = Tensor::empty({experts, out, groups}, DType::U8);
  q.dense = Tensor::empty({experts, in, out});
  auto* b = static_cast<uint8_t*>(q.blocks.raw());
  auto* s = static_cast<uint8_t*>(q.scales.raw());
  for (int64_t i = 0; i < q.blocks.numel(); ++i)
    b[i] = static_cast<uint8_t>(random_u32(5, stream, 2 * i) & 0xff);
  for (int64_t i = 0; i < q.scales.numel(); ++i)
    s[i] = static_cast<uint8_t>(121 + random_u32(5, stream, 2 * i + 1) % 3);  // 2^-6 .. 2^-4
  float* d = q.dense.data<float>();
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const int64_t block = (e * out + r) * groups + c / 32;
        const uint8_t byte = b[block * 16 + (c % 32) / 2];
        const uint8_t code = c % 2 == 0 ? byte & 0x0f : byte >> 4;
        d[(e * in + c) * out + r] = kTable[code] * std::pow(2.0f, static_cast<float>(s[block]) - 127.0f);
      }
  return q;
}

// A gpt-oss model (d and inter multiples of 32) with random MXFP4 experts: returns the tensors of its
// quantised checkpoint (gate_up_proj / down_proj as _blocks and _scales) and sets m's experts to the values
// they encode, which the dense reference computes with.
inline std::map<std::string, Tensor> quantise_gpt_oss_experts(HfTestModel& m) {
  std::map<std::string, Tensor> file = m.tensors;
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = m.layer(l) + "mlp.experts.";
    const Quantised gu = random_mxfp4(m.experts, m.d, 2 * m.inter, 100 + static_cast<uint64_t>(l));
    const Quantised dn = random_mxfp4(m.experts, m.inter, m.d, 200 + static_cast<uint64_t>(l));
    m.tensors[p + "gate_up_proj"] = gu.dense;
    m.tensors[p + "down_proj"] = dn.dense;
    file.erase(p + "gate_up_proj");
    file.erase(p + "down_proj");
    file[p + "gate_up_proj_blocks"] = gu.blocks;
    file[p + "gate_up_proj_scales"] = gu.scales;
    file[p + "down_proj_blocks"] = dn.blocks;
    file[p + "down_proj_scales"] = dn.scales;
  }
  return file;
}

// The config.json of such a checkpoint: quantization_config mxfp4, as gpt-oss's releases write it.
inline nlohmann::json mxfp4_config(const HfTestModel& m) {
  nlohmann::json j = m.config();
  j["quantization_config"] = {{"quant_method", "mxfp4"},
                              {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}};
  return j;
}

inline std::vector<int32_t> vocab_tokens(uint64_t stream, int n, int vocab) {
  std::vector<int32_t> v = random_tokens(stream, n);
  for (int32_t& t : v) t %= vocab;
  return v;
}

// Mixtral with 128-wide matrices: whole 128 × 128 FP8 blocks (an intermediate of 256 whole or halved).
inline HfTestModel mixtral_fp8_test_model(int64_t inter = 256) {
  HfTestModel m;
  m.format = ModelFormat::Mixtral;
  m.shared = 0;
  m.eps = 1e-5f;
  m.d = 128;
  m.inter = inter;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 32;
  m.experts = 8;
  m.top_k = 2;
  m.randomize(71);
  return m;
}

// Block-scaled FP8 of every linear weight the products multiply (attention projections, routed experts,
// shared expert), stored as DeepSeek-V3's and Qwen3's FP8 checkpoints store them (NAME F8_E4M3 and
// NAME_scale_inv F32 per 128 × 128 block; core/tensor_convert.hpp's to_fp8_blocks), and the checkpoint of
// the F32 values they encode (everything else the same in both).
struct Fp8Checkpoint {
  std::map<std::string, Tensor> stored, dequantised;
};
inline bool fp8_product_weight(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  // Attention projections (latent attention's too), routed experts, shared experts and dense MLPs; not the
  // router (mlp.gate.weight) or the norms.
  return (name.find("self_attn.") != std::string::npos && ends("_proj.weight")) ||
         (name.find(".experts.") != std::string::npos && ends(".weight")) ||
         (name.find(".mlp.") != std::string::npos && ends("_proj.weight"));
}
// `lm_head`: the LM head too (as --weight-dtype fp8 converts it).
inline Fp8Checkpoint fp8_quantised(const std::map<std::string, Tensor>& tensors, bool lm_head = false) {
  Fp8Checkpoint c;
  for (const auto& [name, t] : tensors) {
    if (!fp8_product_weight(name) && !(lm_head && name == "lm_head.weight")) {
      c.stored[name] = c.dequantised[name] = t;
      continue;
    }
    const Tensor codes = to_fp8_blocks(t, MemCategory::Other);
    c.stored[name] = codes;
    c.stored[name + "_scale_inv"] = *codes.block_scales();
    c.dequantised[name] = to_f32(codes, MemCategory::Other);
  }
  return c;
}
inline nlohmann::json fp8_config(const nlohmann::json& config) {
  nlohmann::json j = config;
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"activation_scheme", "dynamic"},
                              {"weight_block_size", {128, 128}}};
  return j;
}

// Every tensor rounded to BF16: as BF16 tensors (a BF16 checkpoint), or as F32 tensors of the same values.
inline std::map<std::string, Tensor> bf16_rounded(const std::map<std::string, Tensor>& tensors,
                                                  bool as_bf16) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : tensors) {
    Tensor r = Tensor::empty(t.shape(), as_bf16 ? DType::BF16 : DType::F32);
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint16_t b = f32_to_bf16(v[i]);
      if (as_bf16)
        static_cast<uint16_t*>(r.raw())[i] = b;
      else
        r.data<float>()[i] = bf16_to_f32(b);
    }
    out[name] = r;
  }
  return out;
}

}  // namespace expar::infer::testing
