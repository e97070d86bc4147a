#include "expar/model/moe_transformer.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "expar/comm/comm.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/moe/expert_slots.hpp"
#include "expar/moe/shared_expert_gate.hpp"
#include "expar/nn/context_parallel_attention.hpp"
#include "expar/nn/cross_entropy.hpp"
#include "expar/nn/embedding.hpp"
#include "expar/nn/init.hpp"
#include "expar/nn/latent_attention.hpp"
#include "expar/nn/linear.hpp"
#include "expar/nn/rmsnorm.hpp"

namespace expar {

namespace {

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape());
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  // numel() is out of line (core/tensor.cpp): read once, not per element, so that the loop vectorises.
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  return out;
}

Tensor int_tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// DeepSeek's checkpoints rotate adjacent pairs of the rope parts (rope_interleave); every other family pairs
// the two halves.
nn::Rope model_rope(const ModelConfig& config, const ModelFeatures& features) {
  const nn::RopePairing pairing = features.mla.enabled() && features.mla.rope_interleave
                                      ? nn::RopePairing::Interleaved
                                      : nn::RopePairing::Half;
  return nn::Rope(config.head_dim, config.max_seq, rope_scaling(config, features), pairing);
}

nn::LatentAttentionShape latent_shape(const ModelConfig& config, const LatentAttentionDims& a) {
  nn::LatentAttentionShape s;
  s.n_heads = config.heads;
  s.q_lora_rank = a.q_lora_rank;
  s.kv_lora_rank = a.kv_lora_rank;
  s.qk_nope_head_dim = a.qk_nope_head_dim;
  s.qk_rope_head_dim = a.qk_rope_head_dim;
  s.v_head_dim = a.v_head_dim;
  s.softmax_scale = a.softmax_scale;
  return s;  // norm_eps: the latent norms' 1e-6, whatever the model's norm_eps (as DeepSeek's code)
}

// One SwiGLU MLP on moe/expert_mlp (the shared expert, a dense layer's MLP): rows -> out [rows, d].
void mlp_forward(const Tensor& x, const ExpertWeights& w, Tensor& out, ExpertMlpState* state) {
  const std::vector<int64_t> offsets{0, x.dim(0)};
  out = Tensor::empty({x.dim(0), x.dim(1)});
  expert_mlp_forward(x, PayloadFormat::F32, offsets, w, out, state);
}

}  // namespace

struct MoeTransformer::Block {
  Tensor attn_norm, attn_norm_grad, mlp_norm, mlp_norm_grad;
  nn::AttentionWeights attn;
  nn::AttentionGrads attn_grad;
  nn::AttentionOptions attn_options;  // the family's biases, q/k norms and window (handles on parameters)
  nn::AttentionOptionGrads attn_option_grads;
  std::unique_ptr<MoeLayer> moe;  // null in a dense MLP layer
  // Latent attention (features.mla): in place of attn/attn_grad.
  nn::LatentAttentionWeights mla;
  nn::LatentAttentionGrads mla_grad;
  // A dense MLP layer's SwiGLU MLP, viewed as one expert over "mlp.w1|w3|w2" (as the shared expert).
  ExpertWeights dense, dense_grad;
  // Optional shared expert: one SwiGLU expert on moe/expert_mlp, its weights and gradients viewed as
  // [1, h, d] / [1, d, h] over the parameters "shared.w1|w3|w2" ([h, d], [h, d], [d, h]).
  ExpertWeights shared, shared_grad;
  Tensor shared_scale, shared_scale_grad;  // [1, d]: shared output scaled by sigmoid(x · w) (Qwen-MoE)
};

struct MoeTransformer::Activations {
  struct PerBlock {
    nn::RmsNormSaved attn_norm, mlp_norm;
    nn::AttentionSaved attn;
    nn::LatentAttentionSaved mla;
    MoeState moe;
    ExpertMlpState dense;               // a dense MLP layer's saved state
    ExpertMlpState shared;              // the shared expert's saved state
    Tensor shared_in, shared_out;       // with a shared-expert scale: its input and unscaled output
    std::vector<float> shared_sigmoid;  // per token: sigmoid(x · w)
  };
  std::vector<PerBlock> blocks;
  nn::EmbeddingSaved embed;
  nn::RmsNormSaved final_norm;
  nn::LinearSaved head;
};

MoeTransformer::MoeTransformer(ModelConfig config, ModelExecution execution, Comm& ep_group,
                               int64_t max_microbatch_tokens, ModelFeatures features)
    : config_(std::move(config)),
      execution_(std::move(execution)),
      features_(std::move(features)),
      ep_group_(ep_group),
      rope_(model_rope(config_, features_)) {
  config_.moe.model_dim = config_.model_dim;
  // The family's router and experts (gpt-oss: router bias, expert biases, clamped SwiGLU) are the MoE
  // layer's; the features are the one place that says which.
  config_.moe.router_bias = features_.router == RouterKind::BiasedTopkSoftmax;
  config_.moe.expert_biases = features_.fused_experts;
  config_.moe.activation = features_.activation;
  config_.validate();
  execution_.validate(config_, ep_group.size());
  EXPAR_CHECK(features_.window.empty() || static_cast<int>(features_.window.size()) == config_.layers,
              "the model has {} layers but its features list {} attention windows", config_.layers,
              features_.window.size());
  const LatentAttentionDims& mla = features_.mla;
  EXPAR_CHECK(!execution_.bf16_products || !mla.enabled(),
              "--precision bf16 does not run multi-head latent attention (DeepSeek-V2/V3): its products are "
              "f32 only; train this model with --precision f32");
  if (mla.enabled()) {
    latent_shape(config_, mla).validate();
    EXPAR_CHECK(config_.head_dim == mla.qk_rope_head_dim,
                "latent attention rotates qk_rope_head_dim = {} values per head, but the model's head_dim "
                "(the rope's width) is {}: they must be equal",
                mla.qk_rope_head_dim, config_.head_dim);
    EXPAR_CHECK(!features_.qkv_bias && !features_.o_bias && !features_.attention_sinks &&
                    features_.qk_norm == QkNorm::None && features_.window.empty(),
                "latent attention has no q/k/v/o biases, sinks, q/k norms or sliding windows: the model's "
                "features combine them");
  }
  EXPAR_CHECK(features_.dense_mlp.empty() || static_cast<int>(features_.dense_mlp.size()) == config_.layers,
              "the model has {} layers but its features mark {} layers dense or MoE", config_.layers,
              features_.dense_mlp.size());
  int moe_layers = 0;
  for (int l = 0; l < config_.layers; ++l) {
    if (!features_.is_dense_mlp(l)) {
      ++moe_layers;
      continue;
    }
    EXPAR_CHECK(features_.dense_mlp_hidden > 0,
                "layer {} is a dense MLP layer but the dense MLP's width (intermediate_size) is {}", l,
                features_.dense_mlp_hidden);
    EXPAR_CHECK(
        !execution_.recomputes_moe(l) || execution_.recompute_every_moe,
        "recompute_moe_layers names block {}, a dense MLP layer without an MoE MLP to recompute: list "
        "MoE blocks only",
        l);
  }
  EXPAR_CHECK(moe_layers > 0,
              "every one of the model's {} layers is a dense MLP layer: an MoE model needs at least one MoE "
              "layer (expert parallelism has no experts to place)",
              config_.layers);
  const int64_t d = config_.model_dim, hq = config_.heads * config_.head_dim,
                hkv = config_.kv_heads * config_.head_dim;
  params_.reserve(static_cast<size_t>(config_.layers) * 16 + 4);
  auto& embed = add_param("embed", {config_.vocab, d}, ParamKind::Dense, false);
  embed_ = embed.value;
  embed_grad_ = embed.grad;
  if (path_traits(execution_.moe.path).shared_heap && max_microbatch_tokens > 0) {
    // Slots hold the most rows any rank can receive under the capacity policy (dropless: the bound
    // M_E * T * min(K, E_L)), so with a capacity factor resident symmetric memory stays ~cf*T*K per rank.
    const ExpertPlacement placement =
        execution_.moe.expert_placement(config_.moe.router.num_experts, ep_group.size());
    const int64_t rows = max_capacity_rows(max_microbatch_tokens, config_.moe.router.top_k, placement,
                                           execution_.moe.capacity);
    heap_ = ep_group.make_heap();
    lease_pool_ = std::make_unique<LeasePool>(*heap_, "moe.dispatch",
                                              rowwise_slot_bytes(rows, d, execution_.moe.precision));
  }
  for (int l = 0; l < config_.layers; ++l) {
    auto b = std::make_unique<Block>();
    const std::string p = "layers." + std::to_string(l);
    auto& an = add_param(p + ".attn_norm", {d}, ParamKind::Dense, false);
    b->attn_norm = an.value;
    b->attn_norm_grad = an.grad;
    auto bind = [&](const char* n, Shape s, Tensor& v, Tensor& g) {
      auto& par = add_param(p + n, std::move(s), ParamKind::Dense, true);
      v = par.value;
      g = par.grad;
    };
    // Biases and norm gains: no weight decay.
    auto bind_vector = [&](const char* n, int64_t size, Tensor& v, Tensor& g) {
      auto& par = add_param(p + n, {size}, ParamKind::Dense, false);
      v = par.value;
      g = par.grad;
    };
    if (mla.enabled()) {
      const nn::LatentAttentionShape ls = latent_shape(config_, mla);
      nn::LatentAttentionWeights& w = b->mla;
      nn::LatentAttentionGrads& g = b->mla_grad;
      if (mla.q_lora_rank == 0) {
        bind(".attn.wq", {ls.q_width(), d}, w.wq, g.wq);
      } else {
        bind(".attn.wq_a", {mla.q_lora_rank, d}, w.wq_a, g.wq_a);
        bind_vector(".attn.q_a_norm", mla.q_lora_rank, w.q_a_norm, g.q_a_norm);
        bind(".attn.wq_b", {ls.q_width(), mla.q_lora_rank}, w.wq_b, g.wq_b);
      }
      bind(".attn.wkv_a", {ls.kv_a_width(), d}, w.wkv_a, g.wkv_a);
      bind_vector(".attn.kv_a_norm", mla.kv_lora_rank, w.kv_a_norm, g.kv_a_norm);
      bind(".attn.wkv_b", {ls.kv_b_width(), mla.kv_lora_rank}, w.wkv_b, g.wkv_b);
      bind(".attn.wo", {d, ls.context_width()}, w.wo, g.wo);
    } else {
      bind(".attn.wq", {hq, d}, b->attn.wq, b->attn_grad.wq);
      bind(".attn.wk", {hkv, d}, b->attn.wk, b->attn_grad.wk);
      bind(".attn.wv", {hkv, d}, b->attn.wv, b->attn_grad.wv);
      bind(".attn.wo", {d, hq}, b->attn.wo, b->attn_grad.wo);
    }
    nn::AttentionOptions& ao = b->attn_options;
    nn::AttentionOptionGrads& ag = b->attn_option_grads;
    if (features_.qkv_bias) {
      bind_vector(".attn.bq", hq, ao.bq, ag.bq);
      bind_vector(".attn.bk", hkv, ao.bk, ag.bk);
      bind_vector(".attn.bv", hkv, ao.bv, ag.bv);
    }
    if (features_.o_bias) bind_vector(".attn.bo", d, ao.bo, ag.bo);
    if (features_.attention_sinks) bind_vector(".attn.sinks", config_.heads, ao.sinks, ag.sinks);
    ao.qk_norm = features_.qk_norm;
    ao.qk_norm_eps = config_.norm_eps;
    if (features_.qk_norm != QkNorm::None) {
      const bool per_head = features_.qk_norm == QkNorm::PerHead;
      bind_vector(".attn.q_norm", per_head ? config_.head_dim : hq, ao.q_norm, ag.q_norm);
      bind_vector(".attn.k_norm", per_head ? config_.head_dim : hkv, ao.k_norm, ag.k_norm);
    }
    ao.window = features_.window_of(l);
    auto& mn = add_param(p + ".mlp_norm", {d}, ParamKind::Dense, false);
    b->mlp_norm = mn.value;
    b->mlp_norm_grad = mn.grad;
    if (features_.is_dense_mlp(l)) {
      // A dense MLP in place of the MoE MLP (and its shared expert), one SwiGLU expert's computation.
      const int64_t hd = features_.dense_mlp_hidden;
      Tensor w1, w3, w2, g1, g3, g2;
      bind(".mlp.w1", {hd, d}, w1, g1);
      bind(".mlp.w3", {hd, d}, w3, g3);
      bind(".mlp.w2", {d, hd}, w2, g2);
      b->dense = {w1.reshape({1, hd, d}), w3.reshape({1, hd, d}), w2.reshape({1, d, hd})};
      b->dense_grad = {g1.reshape({1, hd, d}), g3.reshape({1, hd, d}), g2.reshape({1, d, hd})};
      blocks_.push_back(std::move(b));
      continue;
    }
    if (config_.shared_expert_hidden > 0) {
      const int64_t hs = config_.shared_expert_hidden;
      Tensor w1, w3, w2, g1, g3, g2;
      bind(".shared.w1", {hs, d}, w1, g1);
      bind(".shared.w3", {hs, d}, w3, g3);
      bind(".shared.w2", {d, hs}, w2, g2);
      b->shared = {w1.reshape({1, hs, d}), w3.reshape({1, hs, d}), w2.reshape({1, d, hs})};
      b->shared_grad = {g1.reshape({1, hs, d}), g3.reshape({1, hs, d}), g2.reshape({1, d, hs})};
      if (features_.shared_expert_gate) bind(".shared.gate", {1, d}, b->shared_scale, b->shared_scale_grad);
    }
    b->moe = std::make_unique<MoeLayer>(config_.moe, execution_.moe, ep_group, p + ".moe",
                                        MoeSharedResources{heap_.get(), lease_pool_.get(), l});
    b->moe->set_recompute(execution_.recomputes_moe(l));
    // The MoE layer's own tensors (router, experts), viewed as parameters.
    auto add_moe_param = [&](std::string name, Tensor value, Tensor grad, ParamKind kind, bool decay) {
      Parameter par;
      par.name = std::move(name);
      par.value = std::move(value);
      par.grad = std::move(grad);
      par.kind = kind;
      par.weight_decay = decay;
      params_.push_back(std::move(par));
    };
    MoeParams& mp = b->moe->params();
    MoeGrads& mg = b->moe->grads();
    add_moe_param(p + ".moe.router", mp.w_router, mg.w_router, ParamKind::Dense, false);
    if (mp.router_bias.defined())
      add_moe_param(p + ".moe.router_bias", mp.router_bias, mg.router_bias, ParamKind::Dense, false);
    add_moe_param(p + ".moe.experts.w1", mp.experts.w1, mg.experts.w1, ParamKind::Expert, true);
    add_moe_param(p + ".moe.experts.w3", mp.experts.w3, mg.experts.w3, ParamKind::Expert, true);
    add_moe_param(p + ".moe.experts.w2", mp.experts.w2, mg.experts.w2, ParamKind::Expert, true);
    if (mp.experts.has_biases())  // gate, up and down biases: no weight decay
      for (auto [key, value, grad] :
           {std::tuple{".b1", mp.experts.b1, mg.experts.b1}, std::tuple{".b3", mp.experts.b3, mg.experts.b3},
            std::tuple{".b2", mp.experts.b2, mg.experts.b2}})
        add_moe_param(p + ".moe.experts" + key, value, grad, ParamKind::Expert, false);
    blocks_.push_back(std::move(b));
  }
  mark_replica_norm_rows();
  auto& fn = add_param("final_norm", {d}, ParamKind::Dense, false);
  final_norm_ = fn.value;
  final_norm_grad_ = fn.grad;
  if (features_.tied_embeddings) {
    // tie_word_embeddings: one parameter is both the embedding and the LM head; the head's gradient and the
    // embedding's add into the same tensor, and saves hold no lm_head.
    head_ = embed_;
    head_grad_ = embed_grad_;
  } else {
    auto& head = add_param("lm_head", {config_.vocab, d}, ParamKind::Dense, true);
    head_ = head.value;
    head_grad_ = head.grad;
  }
}

MoeTransformer::~MoeTransformer() = default;

void MoeTransformer::mark_replica_norm_rows() {
  // Redundant expert slots: a replicated expert's slots hold the same summed gradient in training
  // (train/expert_replicas.hpp), so only its first slot counts in the gradient norm.
  const ExpertPlacement& placement = first_moe().placement();
  const std::vector<bool> first =
      placement.has_replicas() ? first_replica_slots(placement, first_moe().ep_rank()) : std::vector<bool>{};
  for (Parameter& p : params_)
    if (p.kind == ParamKind::Expert) p.norm_rows = first;
}

void MoeTransformer::set_expert_placement(const ExpertPlacement& next) {
  for (auto& b : blocks_)
    if (b->moe) b->moe->set_placement(next);
  mark_replica_norm_rows();
}

void MoeTransformer::refresh_bf16_copies() {
  if (!execution_.bf16_products) return;
  constexpr MemCategory dense = MemCategory::DenseWeights;
  for (auto& b : blocks_) {
    nn::AttentionWeights& w = b->attn;
    refresh_bf16_copy(w.wq, w.wq_bf16, dense);
    refresh_bf16_copy(w.wk, w.wk_bf16, dense);
    refresh_bf16_copy(w.wv, w.wv_bf16, dense);
    refresh_bf16_copy(w.wo, w.wo_bf16, dense);
    if (b->moe) expar::refresh_bf16_copies(b->moe->params().experts);
    if (b->shared.w1.defined()) expar::refresh_bf16_copies(b->shared, dense);
    if (b->dense.w1.defined()) expar::refresh_bf16_copies(b->dense, dense);
  }
  refresh_bf16_copy(head_, head_bf16_, dense);
  link_bf16_copies();
}

void MoeTransformer::link_bf16_copies() {
  // Each copy against the parameter whose storage its master is (a shared or dense expert's [1, h, d] is a
  // view of its [h, d] parameter; the tied LM head is the embedding).
  std::vector<std::pair<const void*, Tensor>> copies;
  auto add = [&](const Tensor& master, const Tensor& copy) { copies.emplace_back(master.raw(), copy); };
  auto add_experts = [&](const ExpertWeights& w) {
    add(w.w1, w.w1_bf16);
    add(w.w3, w.w3_bf16);
    add(w.w2, w.w2_bf16);
  };
  for (auto& b : blocks_) {
    const nn::AttentionWeights& w = b->attn;
    for (auto [master, copy] : {std::pair{&w.wq, &w.wq_bf16}, std::pair{&w.wk, &w.wk_bf16},
                                std::pair{&w.wv, &w.wv_bf16}, std::pair{&w.wo, &w.wo_bf16}})
      if (copy->defined()) add(*master, *copy);
    if (b->moe) add_experts(b->moe->params().experts);
    if (b->shared.w1.defined()) add_experts(b->shared);
    if (b->dense.w1.defined()) add_experts(b->dense);
  }
  add(head_, head_bf16_);
  for (Parameter& p : params_) {
    p.bf16_copy = Tensor();
    for (const auto& [master, copy] : copies)
      if (master == p.value.raw() && copy.numel() == p.value.numel()) p.bf16_copy = copy;
  }
}

void MoeTransformer::freeze_leases() {
  if (lease_pool_) lease_pool_->freeze();
}

void MoeTransformer::set_microbatch(int microbatch) {
  for (auto& b : blocks_)
    if (b->moe) b->moe->set_microbatch(microbatch);
}

bool MoeTransformer::has_moe(int layer) const {
  return blocks_.at(static_cast<size_t>(layer))->moe != nullptr;
}

MoeLayer& MoeTransformer::moe(int layer) {
  EXPAR_CHECK(layer >= 0 && layer < config_.layers, "block {} does not exist (the model has blocks 0 .. {})",
              layer, config_.layers - 1);
  MoeLayer* m = blocks_[static_cast<size_t>(layer)]->moe.get();
  EXPAR_CHECK(m != nullptr, "block {} is a dense MLP layer: it has no MoE layer (check has_moe first)",
              layer);
  return *m;
}

MoeLayer& MoeTransformer::first_moe() {
  for (auto& b : blocks_)
    if (b->moe) return *b->moe;
  fail("the model has no MoE layer");
}

bool MoeTransformer::recomputes_moe(int layer) const {
  const MoeLayer* m = blocks_.at(static_cast<size_t>(layer))->moe.get();
  return m != nullptr && m->recompute();
}

void MoeTransformer::set_recompute_moe(int layer, bool recompute) {
  EXPAR_CHECK(layer >= 0 && layer < config_.layers,
              "set_recompute_moe: block {} does not exist (the model has blocks 0 .. {})", layer,
              config_.layers - 1);
  MoeLayer* m = blocks_[static_cast<size_t>(layer)]->moe.get();
  if (m == nullptr) {
    EXPAR_CHECK(!recompute,
                "set_recompute_moe: block {} is a dense MLP layer, without an MoE MLP to recompute", layer);
    return;
  }
  m->set_recompute(recompute);
}

Parameter& MoeTransformer::add_param(const std::string& name, Shape shape, ParamKind kind, bool decay) {
  params_.push_back(make_parameter(name, std::move(shape), kind, decay));
  return params_.back();
}

void MoeTransformer::init(uint64_t seed) {
  const auto d = static_cast<float>(config_.model_dim);
  const float out_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (Parameter& p : params_) {
    if (p.name.find(".moe.") != std::string::npos) continue;  // the MoE layers initialise their own
    const std::string& n = p.name;
    if (n.ends_with("norm")) {
      nn::init_constant(p.value, 1.0f);
    } else if (p.value.ndim() == 1) {  // attention biases and sink logits
      nn::init_constant(p.value, 0.0f);
    } else if (n == "embed") {
      // Tied, the embedding is the LM head too: unit-variance rows would give logits of variance d at the
      // start, so it starts at 1/sqrt(d) (the first RMSNorm makes the scale irrelevant to the blocks).
      nn::init_normal(p.value, seed, n, features_.tied_embeddings ? 1.0f / std::sqrt(d) : 1.0f);
    } else {
      const auto fan_in = static_cast<float>(p.value.dim(1));
      float stddev = 1.0f / std::sqrt(fan_in);
      if (n.ends_with(".wo") || n.ends_with(".shared.w2") || n.ends_with(".mlp.w2")) stddev *= out_scale;
      if (n == "lm_head") stddev = 1.0f / d;
      nn::init_normal(p.value, seed, n, stddev);
    }
  }
  for (auto& b : blocks_)
    if (b->moe) b->moe->init_params(seed);
}

void MoeTransformer::set_context_parallel(Comm* cp, int loss_batches) {
  EXPAR_CHECK(loss_batches >= 1, "context parallelism: loss_batches={} must be at least 1", loss_batches);
  cp_group_ = cp;
  loss_batches_ = loss_batches;
}

void MoeTransformer::zero_grads() {
  // Each MoE layer zeroes its own gradients (router and experts), which lets its next backward write the
  // experts' weight gradients instead of adding them (MoeLayer::zero_grads). The expert parameters are theirs
  // alone; the router's, also in params_, are zeroed twice ([E, d]: nothing to save).
  for (auto& b : blocks_)
    if (b->moe) b->moe->zero_grads();
  for (Parameter& p : params_)
    if (p.kind != ParamKind::Expert) p.grad.zero();
}

Tensor MoeTransformer::forward(const std::vector<int32_t>& tokens, int64_t batch, int64_t seq,
                               Activations* acts, StepMetrics& metrics) {
  EXPAR_CHECK(static_cast<int64_t>(tokens.size()) == batch * seq, "got {} tokens for batch {} x seq {}",
              tokens.size(), batch, seq);
  EXPAR_CHECK(seq <= config_.max_seq, "sequence length {} exceeds the model's max_seq {}: shorten --seq-len",
              seq, config_.max_seq);
  const nn::AttentionShape shape{config_.heads, config_.kv_heads, config_.head_dim};
  if (acts) acts->blocks.resize(blocks_.size());
  Tensor h = nn::embedding_forward(embed_, int_tensor(tokens), acts ? &acts->embed : nullptr);
  RouterLossScope loss_scope;  // this rank's tokens, one batch
  if (config_.moe.router.aux_loss_kind == AuxLossKind::Sequence) {
    // DeepSeek's sequence-wise loss: one batch per sequence, in a training forward over the whole sequence
    // (its chunks' statistics summed over the CP group).
    loss_scope = {acts ? cp_group_ : nullptr, static_cast<int>(std::max<int64_t>(batch, 1))};
  } else if (acts && cp_group_) {
    EXPAR_CHECK(batch % loss_batches_ == 0,
                "a training forward of {} sequences cannot form the {} router loss batches of "
                "set_context_parallel: pass a multiple of {} sequences",
                batch, loss_batches_, loss_batches_);
    loss_scope = {cp_group_, loss_batches_};
  }
  for (auto& b : blocks_)
    if (b->moe) b->moe->set_loss_scope(loss_scope);
  double aux = 0, z = 0, drop = 0, util = 0;
  int moe_blocks = 0;
  const bool latent = features_.mla.enabled();
  const nn::LatentAttentionShape lshape =
      latent ? latent_shape(config_, features_.mla) : nn::LatentAttentionShape{};
  metrics.expert_counts.clear();
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = *blocks_[l];
    Activations::PerBlock* a = acts ? &acts->blocks[l] : nullptr;
    MoeState local_state;
    MoeState& moe_state = a ? a->moe : local_state;
    Tensor n1 = nn::rmsnorm_forward(h, b.attn_norm, config_.norm_eps, a ? &a->attn_norm : nullptr);
    nn::AttentionSaved* saved_attn = a ? &a->attn : nullptr;
    nn::LatentAttentionSaved* saved_mla = a ? &a->mla : nullptr;
    Tensor att =
        latent && cp_group_
            ? nn::cp_latent_attention_forward(*cp_group_, lshape, rope_, b.mla, n1, batch, seq, saved_mla)
        : latent    ? nn::latent_attention_forward(lshape, rope_, b.mla, n1, batch, seq, saved_mla)
        : cp_group_ ? nn::cp_attention_forward(*cp_group_, shape, rope_, b.attn, n1, batch, seq, saved_attn,
                                               b.attn_options)
                    : nn::attention_forward(shape, rope_, b.attn, n1, batch, seq, saved_attn, b.attn_options);
    Tensor h1 = add(h, att);
    Tensor n2 = nn::rmsnorm_forward(h1, b.mlp_norm, config_.norm_eps, a ? &a->mlp_norm : nullptr);
    if (!b.moe) {
      // A dense MLP layer: no router, so no losses or routes (its expert_counts row is zero).
      Tensor m;
      mlp_forward(n2, b.dense, m, a ? &a->dense : nullptr);
      h = add(h1, m);
      metrics.expert_counts.resize(metrics.expert_counts.size() +
                                   static_cast<size_t>(config_.moe.router.num_experts));
      continue;
    }
    ++moe_blocks;
    Tensor m = b.moe->forward(n2, moe_state);
    if (b.shared.w1.defined()) {
      const int64_t rows = n2.dim(0), d = n2.dim(1);
      const std::vector<int64_t> offsets{0, rows};
      Tensor so = Tensor::empty({rows, d});
      expert_mlp_forward(n2, PayloadFormat::F32, offsets, b.shared, so, a ? &a->shared : nullptr);
      if (b.shared_scale.defined()) {
        // Qwen-MoE: the shared expert's output scaled by sigmoid(x · w), one scalar per token.
        std::vector<float> sig = shared_expert_gate(n2, b.shared_scale);
        add_gated_rows(sig, so.data<float>(), rows, d, m.data<float>());
        if (a) {
          a->shared_in = n2;
          a->shared_out = so;
          a->shared_sigmoid = std::move(sig);
        }
      } else {
        add_into(m, so);
      }
    }
    h = add(h1, m);
    aux += moe_state.metrics.aux_loss;
    z += moe_state.metrics.z_loss;
    const std::vector<int64_t>& counts = moe_state.metrics.expert_counts;
    metrics.expert_counts.insert(metrics.expert_counts.end(), counts.begin(), counts.end());
    drop += moe_state.metrics.drop_rate;
    util = std::max(util, moe_state.metrics.utilisation);
  }
  const auto layers = static_cast<double>(moe_blocks);
  metrics.aux_loss = aux / layers;
  metrics.z_loss = z / layers;
  metrics.drop_rate = drop / layers;
  metrics.utilisation = util;
  metrics.tokens = batch * seq;
  Tensor hf = nn::rmsnorm_forward(h, final_norm_, config_.norm_eps, acts ? &acts->final_norm : nullptr);
  return nn::linear_forward(hf, head_, nullptr, acts ? &acts->head : nullptr, head_bf16_);
}

MoeTransformer::Pending::Pending() = default;
MoeTransformer::Pending::~Pending() = default;
MoeTransformer::Pending::Pending(Pending&&) noexcept = default;
MoeTransformer::Pending& MoeTransformer::Pending::operator=(Pending&&) noexcept = default;

StepMetrics MoeTransformer::forward_backward(const std::vector<int32_t>& tokens,
                                             const std::vector<int32_t>& targets, int64_t batch, int64_t seq,
                                             int64_t loss_normalizer) {
  Pending pending = forward_train(tokens, targets, batch, seq, loss_normalizer);
  return backward(pending);
}

MoeTransformer::Pending MoeTransformer::forward_train(const std::vector<int32_t>& tokens,
                                                      const std::vector<int32_t>& targets, int64_t batch,
                                                      int64_t seq, int64_t loss_normalizer) {
  Pending pending;
  pending.acts_ = std::make_unique<Activations>();
  Tensor logits = forward(tokens, batch, seq, pending.acts_.get(), pending.metrics_);
  nn::CrossEntropyResult ce = nn::cross_entropy(logits, int_tensor(targets), loss_normalizer);
  pending.metrics_.loss = ce.counted ? ce.loss_sum / static_cast<double>(ce.counted) : 0.0;
  pending.grad_logits_ = std::move(ce.grad_logits);
  return pending;
}

StepMetrics MoeTransformer::backward(Pending& pending) {
  EXPAR_CHECK(!pending.done(),
              "MoeTransformer::backward: this microbatch's backward already ran (or it holds no forward): "
              "run backward once per forward_train");
  // Released when this returns, whatever happens: the MoE blocks' leases go back with their states.
  std::unique_ptr<Activations> owned = std::move(pending.acts_);
  Activations& acts = *owned;
  Tensor grad = nn::linear_backward(acts.head, pending.grad_logits_, head_, head_grad_, nullptr, head_bf16_);
  pending.grad_logits_ = Tensor();
  grad = nn::rmsnorm_backward(acts.final_norm, grad, final_norm_, final_norm_grad_);
  for (size_t li = blocks_.size(); li-- > 0;) {
    Block& b = *blocks_[li];
    auto& a = acts.blocks[li];
    // h = h1 + moe(norm(h1)) [+ shared(norm(h1))], or h1 + mlp(norm(h1)) in a dense layer
    Tensor grad_n2;
    if (!b.moe) {
      grad_n2 = Tensor::empty(grad.shape());
      expert_mlp_backward(grad, a.dense, b.dense, grad_n2, b.dense_grad);
    } else {
      grad_n2 = b.moe->backward(grad, a.moe);
    }
    if (b.moe && b.shared.w1.defined()) {
      const Tensor grad_so = b.shared_scale.defined() ? shared_expert_gate_backward(
                                                            grad, a.shared_out, a.shared_in, b.shared_scale,
                                                            a.shared_sigmoid, b.shared_scale_grad, grad_n2)
                                                      : grad;
      Tensor grad_in = Tensor::empty(grad_n2.shape());
      expert_mlp_backward(grad_so, a.shared, b.shared, grad_in, b.shared_grad);
      add_into(grad_n2, grad_in);
    }
    Tensor grad_h1 = nn::rmsnorm_backward(a.mlp_norm, grad_n2, b.mlp_norm, b.mlp_norm_grad);
    add_into(grad_h1, grad);
    // h1 = h + attn(norm(h))
    const nn::AttentionShape shape{config_.heads, config_.kv_heads, config_.head_dim};
    const bool latent = features_.mla.enabled();
    const nn::LatentAttentionShape lshape =
        latent ? latent_shape(config_, features_.mla) : nn::LatentAttentionShape{};
    Tensor grad_n1 =
        latent && cp_group_
            ? nn::cp_latent_attention_backward(*cp_group_, lshape, rope_, b.mla, a.mla, grad_h1, b.mla_grad)
        : latent    ? nn::latent_attention_backward(lshape, rope_, b.mla, a.mla, grad_h1, b.mla_grad)
        : cp_group_ ? nn::cp_attention_backward(*cp_group_, shape, rope_, b.attn, a.attn, grad_h1,
                                                b.attn_grad, b.attn_options, &b.attn_option_grads)
                    : nn::attention_backward(shape, rope_, b.attn, a.attn, grad_h1, b.attn_grad,
                                             b.attn_options, &b.attn_option_grads);
    grad = nn::rmsnorm_backward(a.attn_norm, grad_n1, b.attn_norm, b.attn_norm_grad);
    add_into(grad, grad_h1);
  }
  nn::embedding_backward(acts.embed, grad, embed_grad_);
  return pending.metrics_;
}

StepMetrics MoeTransformer::evaluate(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                                     int64_t batch, int64_t seq) {
  StepMetrics metrics;
  Tensor logits = forward(tokens, batch, seq, nullptr, metrics);
  nn::CrossEntropyResult ce = nn::cross_entropy(logits, int_tensor(targets));
  metrics.loss = ce.loss;
  return metrics;
}

Tensor MoeTransformer::logits(const std::vector<int32_t>& tokens, int64_t batch, int64_t seq) {
  StepMetrics metrics;
  return forward(tokens, batch, seq, nullptr, metrics);
}

}  // namespace expar
