#include "expar/infer/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/memory.hpp"
#include "expar/core/timer.hpp"
#include "expar/core/weight_matmul.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/expert_moves.hpp"
#include "expar/moe/moe_forward.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/route_map.hpp"
#include "expar/moe/shared_expert_gate.hpp"
#include "expar/nn/attention.hpp"
#include "expar/nn/rmsnorm.hpp"

namespace expar::infer {

namespace {

// Rows of member r when `rows` rows are split as evenly as possible over n members (the SP layout).
int64_t share(int64_t rows, int n, int r) {
  return rows * (r + 1) / n - rows * r / n;
}

std::vector<size_t> element_counts(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<size_t> c(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) c[i] = static_cast<size_t>(rows[i] * width);
  return c;
}

std::vector<int64_t> even_rows(int64_t rows, int n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) v[static_cast<size_t>(r)] = share(rows, n, r);
  return v;
}

// Concatenates every member's rows [rows[r], width] in member order.
Tensor gather_rows(Comm& group, const Tensor& mine, const std::vector<int64_t>& rows, int64_t width) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  Tensor out = Tensor::empty({total, width}, DType::F32, MemCategory::CommScratch);
  const auto counts = element_counts(rows, width);
  group.all_gather_v(mine.raw(), static_cast<size_t>(mine.numel()), out.raw(), counts, DType::F32);
  return out;
}

// Sums every member's [Σ rows, width] and keeps this member's block of rows.
Tensor reduce_scatter_rows(Comm& group, const Tensor& full, const std::vector<int64_t>& rows, int64_t width) {
  Tensor out = Tensor::empty({rows[static_cast<size_t>(group.rank())], width});
  const auto counts = element_counts(rows, width);
  group.reduce_scatter_v(full.raw(), out.raw(), counts, DType::F32);
  return out;
}

Tensor rmsnorm(const Tensor& x, const Tensor& gain, float eps) {
  if (x.dim(0) == 0) return Tensor::empty(x.shape());
  return nn::rmsnorm_forward(x, gain, eps, nullptr);
}

}  // namespace

DecodeMoe decode_moe_from_name(const std::string& name) {
  if (name == "allreduce") return DecodeMoe::AllReduce;
  if (name == "rowwise") return DecodeMoe::Rowwise;
  fail("decode MoE mode '{}' is unknown: choose one of {}", name, fmt::join(decode_moe_names(), ", "));
}

std::string decode_moe_name(DecodeMoe mode) {
  return mode == DecodeMoe::Rowwise ? "rowwise" : "allreduce";
}

std::vector<std::string> decode_moe_names() {
  return {decode_moe_name(DecodeMoe::AllReduce), decode_moe_name(DecodeMoe::Rowwise)};
}

void check_decode_moe(const InferenceLayout& layout, DecodeMoe mode) {
  if (mode != DecodeMoe::Rowwise || layout.ep_tp_size() == 1) return;
  // The rowwise path sends each routed row to ONE rank, whose experts must produce the whole expert output:
  // intermediate-dimension shards would need a second sum over the EP_TP group for every row.
  // Whole experts: ep_degree = g * TP with g dividing DP (g = DP, the default, spans every replica), and the
  // expert slots divisible by it.
  std::vector<int> whole;
  for (int g = 1; g <= layout.dp(); ++g)
    if (layout.dp() % g == 0 && layout.placement().num_slots() % (g * layout.tp()) == 0)
      whole.push_back(g * layout.tp());
  std::string fix = "decode with allreduce";
  if (!whole.empty())
    fix = fmt::format(
        "pass --enable-expert-parallel (enable_expert_parallel) with ep_degree {}{}, or {}",
        whole.size() == 1 ? std::to_string(whole[0]) : fmt::format("in {{{}}}", fmt::join(whole, ",")),
        whole.back() == layout.world() ? " (or unset)" : "", fix);
  fail(
      "rowwise decode needs every expert whole on one rank (ep_tp_size 1: ep_degree a multiple of TP, "
      "TP*DP = {} by default), but TP {} x DP {} with {} shards each expert's intermediate dimension over {} "
      "ranks: {}",
      layout.world(), layout.tp(), layout.dp(),
      layout.expert_parallel() ? fmt::format("ep_degree {}", layout.ep_degree()) : std::string("no EP"),
      layout.ep_tp_size(), fix);
}

struct Engine::Sequence {
  std::vector<nn::KvCache> caches;               // one per layer
  std::vector<nn::LatentKvCache> latent_caches;  // one per layer, with latent attention (instead)
  int64_t capacity = 0;
  int64_t length() const {
    return !latent_caches.empty() ? latent_caches[0].length : caches.empty() ? 0 : caches[0].length;
  }
};

namespace {

// The rope of a model: DeepSeek's latent attention rotates pairs (2i, 2i + 1) of its rope part.
nn::Rope model_rope(const RankWeights& w) {
  const nn::RopePairing pairing = w.features.mla.enabled() && w.features.mla.rope_interleave
                                      ? nn::RopePairing::Interleaved
                                      : nn::RopePairing::Half;
  return nn::Rope(w.config.head_dim, w.config.max_seq, rope_scaling(w.config, w.features), pairing);
}

// One SwiGLU MLP's rows (this rank's intermediate shard w1, w3 [h, d], w2 [d, h]) added into out [m, d],
// through moe/'s expert MLP; `gate` (Qwen's shared expert) scales each row by sigmoid(x · gate).
void swiglu_rows(const Tensor& w1, const Tensor& w3, const Tensor& w2, const Tensor& gate, const Tensor& x,
                 float* out) {
  if (!present(w1) || x.dim(0) == 0) return;
  const int64_t m = x.dim(0), d = x.dim(1), h = w1.dim(0);
  ExpertWeights w{w1.reshape({1, h, d}), w3.reshape({1, h, d}), w2.reshape({1, d, h})};
  const std::vector<int64_t> offsets{0, m};
  Tensor y = Tensor::empty({m, d});
  expert_mlp_forward(x, PayloadFormat::F32, offsets, w, y, nullptr);
  const float* py = y.data<float>();
  if (!present(gate)) {
    for (int64_t i = 0; i < m * d; ++i) out[i] += py[i];
    return;
  }
  // Qwen-MoE: the shared expert's output scaled by sigmoid(x · gate), one scalar per token (moe/'s gate, the
  // training model's); scaling this rank's partial sum by it scales the sum over the TP group alike.
  add_gated_rows(shared_expert_gate(x, gate), py, m, d, out);
}

}  // namespace

Engine::Engine(const InferenceLayout& layout, Comm& world, RankWeights weights, EngineOptions options)
    : layout_(layout),
      options_(options),
      weights_(std::move(weights)),
      rank_(world.rank()),
      tp_rank_(layout.rank_info(world.rank()).tp_rank),
      dp_rank_(layout.rank_info(world.rank()).dp_rank),
      partition_(layout.rank_info(world.rank()).ep_rank),
      rope_(model_rope(weights_)) {
  check_decode_moe(layout_, options_.decode_moe);  // before any collective: every rank refuses alike
  check_product_precision(options_.precision);
  EXPAR_CHECK(weights_.features.window.empty() ||
                  static_cast<int>(weights_.features.window.size()) == weights_.config.layers,
              "the model has {} layers but its features list {} attention windows", weights_.config.layers,
              weights_.features.window.size());
  EXPAR_CHECK(world.size() == layout.world(),
              "the inference layout needs TP*DP={}*{}={} ranks but the world has {}: start {} ranks",
              layout.tp(), layout.dp(), layout.world(), world.size(), layout.world());
  tp_ = world.subgroup(layout.groups(InferenceGroup::Tp), "tp");
  // The replicas whose tokens meet at the experts: the DP replicas of this rank's EP group (single ranks
  // without cross-DP EP).
  dp_ = world.subgroup(layout.groups(InferenceGroup::EpDp), "dp");
  if (weights_.features.qk_norm == QkNorm::Projection && tp_->size() > 1) {
    // OLMoE normalises q and k over every head: the TP ranks' sums of squares over their heads add up to the
    // whole projection's, in one all-reduce per layer. Replicated key/value heads (TP above their count) are
    // counted once per replica, so their sum is divided by the replication.
    const int tp = tp_->size();
    const int64_t kv = weights_.config.kv_heads;
    const float k_share = kv % tp == 0 ? 1.0f : static_cast<float>(kv) / static_cast<float>(tp);
    Comm* group = tp_.get();
    for (LayerWeights& lw : weights_.layers)
      lw.attn_options.sum_squares = [group, k_share](float* q_ss, float* k_ss, int64_t rows) {
        std::vector<float> both(static_cast<size_t>(2 * rows));
        std::copy(q_ss, q_ss + rows, both.begin());
        std::copy(k_ss, k_ss + rows, both.begin() + rows);
        group->all_reduce(both.data(), both.size(), DType::F32, ReduceOp::Sum);
        std::copy(both.begin(), both.begin() + rows, q_ss);
        for (int64_t r = 0; r < rows; ++r) k_ss[r] = both[static_cast<size_t>(rows + r)] * k_share;
      };
  }
  stats_.expert_tokens.assign(static_cast<size_t>(weights_.config.moe.router.num_experts), 0);
  stats_.expert_weight_reads.assign(static_cast<size_t>(weights_.config.layers), 0);
  stats_.layer_rows.assign(static_cast<size_t>(weights_.config.layers), 0);
  stats_.layer_expert_tokens.assign(static_cast<size_t>(weights_.config.layers), stats_.expert_tokens);
  replica_deals_.resize(static_cast<size_t>(weights_.config.layers));
  // Every layer starts in the layout's placement (the loader loaded it in every layer); the route map places
  // each layer's rows by its own, so this rank's weights must hold its partition's experts in the
  // placement's local order.
  EXPAR_CHECK(weights_.local_experts == layout_.placement().local_experts(partition_),
              "rank {}: the layout's {} placement gives expert partition {} other experts than the weights "
              "hold: load the weights with the same layout",
              rank_, placement_name(layout_.placement().kind()), partition_);
  placements_.assign(static_cast<size_t>(weights_.config.layers), layout_.placement());
  local_experts_.assign(static_cast<size_t>(weights_.config.layers), weights_.local_experts);
  // With cross-DP EP (ep_tp_size 1) and for rowwise decode the layout's EP group is this rank's copy of the
  // experts (its ep_dp_size replicas, the whole world with ep_degree = TP*DP), in world rank order, and a
  // rank's partition is its rank in that group.
  if (layout_.expert_parallel() || options_.decode_moe == DecodeMoe::Rowwise)
    ep_ = world.subgroup(layout.groups(InferenceGroup::Ep), "ep");
  PathOptions po;
  po.model_dim = weights_.config.model_dim;
  po.top_k = weights_.config.moe.router.top_k;
  // The engine's paths run without waves, and without waves agrs and rowwise read the placement only from
  // each step's route map (built from the layer's own placement); the options' one is the initial one.
  po.placement = &placements_.front();
  // Seed 002's collective levels, inner first: prefill gathers over TP (SP rows), then, with cross-DP EP,
  // over the DP replicas of the EP group; decode's TP ranks hold the same tokens (all-reduce), those replicas
  // are gathered with cross-DP EP.
  po.agrs_levels = {{tp_.get(), false}};
  if (layout_.cross_dp_ep()) po.agrs_levels.push_back({dp_.get(), false});
  prefill_path_ = make_path("agrs", *tp_, po);
  po.agrs_levels = {{tp_.get(), true}};
  if (layout_.cross_dp_ep()) po.agrs_levels.push_back({dp_.get(), false});
  decode_path_ = make_path("agrs", *tp_, po);
  if (options_.decode_moe == DecodeMoe::Rowwise) {
    po.agrs_levels.clear();
    rowwise_ = make_path("rowwise", *ep_, po);
  }
}

Engine::~Engine() = default;

int Engine::add_sequence(int64_t capacity) {
  EXPAR_CHECK(capacity >= 1 && capacity <= weights_.config.max_seq,
              "sequence capacity {} must be in [1, max_seq={}]: shorten the prompt or the generation",
              capacity, weights_.config.max_seq);
  auto s = std::make_unique<Sequence>();
  s->capacity = capacity;
  for (int l = 0; l < weights_.config.layers; ++l) {
    if (weights_.features.mla.enabled())
      s->latent_caches.push_back(nn::LatentKvCache::create(capacity, weights_.local_latent));
    else
      s->caches.push_back(nn::KvCache::create(capacity, weights_.local_attn));
  }
  sequences_.push_back(std::move(s));
  return static_cast<int>(sequences_.size()) - 1;
}

void Engine::remove_sequence(int id) {
  EXPAR_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[static_cast<size_t>(id)],
              "sequence {} does not exist: pass an id returned by add_sequence", id);
  sequences_[static_cast<size_t>(id)].reset();
}

int64_t Engine::length(int id) const {
  EXPAR_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[static_cast<size_t>(id)],
              "sequence {} does not exist: pass an id returned by add_sequence", id);
  return sequences_[static_cast<size_t>(id)]->length();
}

Tensor Engine::prefill(std::span<const int> ids, const std::vector<std::vector<int32_t>>& tokens,
                       PrefillLogits which) {
  const ScopedProductPrecision precision(options_.precision);
  return step(ids, tokens, true, which);
}

Tensor Engine::decode(std::span<const int> ids, std::span<const int32_t> tokens) {
  EXPAR_CHECK(ids.size() == tokens.size(), "decode got {} tokens for {} sequences: pass one token each",
              tokens.size(), ids.size());
  std::vector<std::vector<int32_t>> per(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) per[i] = {tokens[i]};
  const ScopedProductPrecision precision(options_.precision);
  return step(ids, per, false, PrefillLogits::AllRows);
}

Tensor Engine::embed(const std::vector<int32_t>& flat, int64_t first, int64_t rows, bool prefill) {
  const int64_t d = weights_.config.model_dim, v0 = weights_.vocab_begin, vr = weights_.embed.dim(0);
  const WeightView table = weight_view(weights_.embed);  // its rows widened to f32 as they are looked up
  auto lookup = [&](int64_t begin, int64_t n) {
    Tensor out = Tensor::empty({n, d});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = flat[static_cast<size_t>(begin + i)] - v0;
      float* o = out.data<float>() + i * d;
      if (row >= 0 && row < vr)
        dequantize_rows(table, row, row + 1, o, d);
      else
        std::fill(o, o + d, 0.0f);
    }
    return out;
  };
  // A table used in place from the mapped file (map_rows_as_stored) gives the pages the lookups mapped
  // back at once: each looked-up row maps the 64 KiB around it (the kernel's fault-around), so a 512-token
  // prompt would keep about 32 MiB of a 2 KiB-row table resident through the whole step and after it.
  auto release_table = [&] {
    if (weights_.embed.category() == MemCategory::MappedWeights)
      release_file_pages(weights_.embed.raw(), weights_.embed.nbytes());
  };
  if (tp_->size() == 1) {
    Tensor out = lookup(first, rows);
    release_table();
    return out;
  }
  const auto total = static_cast<int64_t>(flat.size());
  Tensor partial = lookup(0, total);
  release_table();
  if (prefill) return reduce_scatter_rows(*tp_, partial, even_rows(total, tp_->size()), d);
  tp_->all_reduce(partial.raw(), static_cast<size_t>(partial.numel()), DType::F32, ReduceOp::Sum);
  return partial;
}

Tensor Engine::lm_head(const Tensor& x) {
  const int64_t n = x.dim(0), vocab = weights_.config.vocab;
  const int tp = tp_->size();
  // This rank's vocabulary slice, multiplied as stored.
  EXPAR_ASSERT(x.dtype() == DType::F32 && x.dim(1) == weights_.lm_head.dim(1),
               "LM head input {} for a head {}", shape_string(x.shape()),
               shape_string(weights_.lm_head.shape()));
  Tensor mine = Tensor::empty({n, weights_.lm_head.dim(0)});
  if (n > 0)
    matmul_weight(WeightProduct{
        .x = x.data<float>(), .m = n, .w = weight_view(weights_.lm_head), .y = mine.data<float>()});
  if (tp == 1) return mine;
  // The slices arrive rank after rank ([n, V_0] then [n, V_1] ...); each row of the result interleaves them.
  const std::vector<int64_t> slice = even_rows(vocab, tp);
  std::vector<int64_t> counts(slice.size());
  for (size_t r = 0; r < slice.size(); ++r) counts[r] = n * slice[r];
  Tensor parts = gather_rows(*tp_, mine.reshape({mine.numel(), 1}), counts, 1);
  Tensor out = Tensor::empty({n, vocab});
  int64_t offset = 0, col = 0;
  for (int r = 0; r < tp; ++r) {
    const int64_t w = slice[static_cast<size_t>(r)];
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.data<float>() + i * vocab + col, parts.data<float>() + offset + i * w,
                  sizeof(float) * static_cast<size_t>(w));
    offset += n * w;
    col += w;
  }
  return out;
}

Tensor Engine::step(std::span<const int> ids, const std::vector<std::vector<int32_t>>& tokens, bool prefill,
                    PrefillLogits which) {
  Timer timer;
  const ModelConfig& c = weights_.config;
  const int64_t d = c.model_dim;
  EXPAR_CHECK(ids.size() == tokens.size(), "{} token lists for {} sequences: pass one list per sequence",
              tokens.size(), ids.size());
  std::vector<int64_t> new_tokens;
  std::vector<int32_t> flat;
  const bool latent = weights_.features.mla.enabled();
  std::vector<std::vector<nn::KvCache*>> caches(static_cast<size_t>(c.layers));
  std::vector<std::vector<nn::LatentKvCache*>> latent_caches(static_cast<size_t>(c.layers));
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    EXPAR_CHECK(id >= 0 && id < static_cast<int>(sequences_.size()) && sequences_[static_cast<size_t>(id)],
                "sequence {} does not exist: pass an id returned by add_sequence", id);
    Sequence& s = *sequences_[static_cast<size_t>(id)];
    const auto n = static_cast<int64_t>(tokens[i].size());
    EXPAR_CHECK(s.length() + n <= s.capacity,
                "sequence {} holds {} tokens and adds {}, beyond its capacity {}: add it with a larger "
                "capacity",
                id, s.length(), n, s.capacity);
    EXPAR_CHECK(n > 0 || which == PrefillLogits::AllRows,
                "sequence {} adds no tokens but its last row's logits are asked for: pass at least one token "
                "per sequence, or ask for all rows",
                id);
    for (int32_t t : tokens[i])
      EXPAR_CHECK(t >= 0 && t < c.vocab,
                  "sequence {}: token {} is outside the vocabulary [0, {}): check the tokenizer and the "
                  "model's vocab_size",
                  id, t, c.vocab);
    new_tokens.push_back(n);
    flat.insert(flat.end(), tokens[i].begin(), tokens[i].end());
    for (int l = 0; l < c.layers; ++l) {
      if (latent)
        latent_caches[static_cast<size_t>(l)].push_back(&s.latent_caches[static_cast<size_t>(l)]);
      else
        caches[static_cast<size_t>(l)].push_back(&s.caches[static_cast<size_t>(l)]);
    }
  }
  const auto total = static_cast<int64_t>(flat.size());
  const int tp = tp_->size();
  // Prefill keeps the residual stream in SP layout: this rank owns rows [row0, row0 + rows).
  const std::vector<int64_t> sp_rows = even_rows(total, tp);
  const int64_t row0 = total * tp_rank_ / tp;
  const int64_t rows = prefill ? sp_rows[static_cast<size_t>(tp_rank_)] : total;
  const int64_t first = prefill ? row0 : 0;

  Tensor h = embed(flat, first, rows, prefill);

  for (int l = 0; l < c.layers; ++l) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(l)];
    Tensor n1 = rmsnorm(h, lw.attn_norm, c.norm_eps);
    if (prefill) n1 = gather_rows(*tp_, n1, sp_rows, d);
    Tensor att;
    if (total == 0) {
      att = Tensor::zeros({0, d});
    } else if (latent) {
      const nn::LatentForm form =
          options_.latent_form.value_or(prefill ? nn::LatentForm::Expanded : nn::LatentForm::Absorbed);
      att = nn::latent_attention_forward_cached(weights_.local_latent, rope_, lw.mla, n1, new_tokens,
                                                latent_caches[static_cast<size_t>(l)], form);
    } else {
      att = nn::attention_forward_cached(weights_.local_attn, rope_, lw.attn, n1, new_tokens,
                                         caches[static_cast<size_t>(l)], lw.attn_options);
    }
    // Each rank's attention output is a partial sum over its heads.
    if (prefill) {
      att = reduce_scatter_rows(*tp_, att, sp_rows, d);
    } else {
      tp_->all_reduce(att.raw(), static_cast<size_t>(att.numel()), DType::F32, ReduceOp::Sum);
    }
    add_into(h, att);
    // Done with: the MoE block's buffers, a prefill's largest, need not sit beside them.
    n1 = Tensor();
    att = Tensor();
    Tensor n2 = rmsnorm(h, lw.mlp_norm, c.norm_eps);
    Tensor m = weights_.features.is_dense_mlp(l)                       ? dense_mlp(l, n2, prefill, sp_rows)
               : !prefill && options_.decode_moe == DecodeMoe::Rowwise ? moe_decode_rowwise(l, n2)
                                                                       : moe_agrs(l, n2, prefill);
    add_into(h, m);
  }
  Tensor hf = rmsnorm(h, weights_.final_norm, c.norm_eps);
  if (prefill) hf = gather_rows(*tp_, hf, sp_rows, d);
  if (which == PrefillLogits::LastRow) {  // the last new row of each sequence
    Tensor last = Tensor::empty({static_cast<int64_t>(ids.size()), d});
    int64_t end = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      end += new_tokens[i];
      std::memcpy(last.data<float>() + static_cast<int64_t>(i) * d, hf.data<float>() + (end - 1) * d,
                  sizeof(float) * static_cast<size_t>(d));
    }
    hf = std::move(last);
  }
  Tensor logits = lm_head(hf);
  (prefill ? stats_.prefill_tokens : stats_.decode_tokens) += total;
  (prefill ? stats_.prefill_seconds : stats_.decode_seconds) += timer.seconds();
  return logits;
}

MoeWeights Engine::moe_weights(int layer) const {
  const LayerWeights& lw = weights_.layers[static_cast<size_t>(layer)];
  MoeWeights w;
  w.w_router = &lw.router;
  w.score_bias = present(lw.score_bias) ? &lw.score_bias : nullptr;
  w.router_bias = present(lw.router_bias) ? &lw.router_bias : nullptr;
  w.experts = &lw.experts;
  return w;
}

Tensor Engine::moe_forward_counted(int layer, const Tensor& x, const MoeForwardOptions& options) {
  // Inference has no capacity policy and keeps no activations: the rest is the training layer's forward.
  MoeForwardOptions o = options;
  o.capacity = CapacityPolicy::dropless();
  o.keep_activations = false;
  o.replica_deal = &replica_deals_[static_cast<size_t>(layer)];
  MoeState state;
  const auto at = static_cast<size_t>(layer);
  Tensor y = moe_forward(weights_.config.moe, placements_[at], moe_weights(layer), x, o, state);
  const std::vector<int64_t>& offsets = state.routes.expert_offsets;
  for (size_t l = 0; l + 1 < offsets.size(); ++l) {
    const auto expert = static_cast<size_t>(local_experts_[at][l]);
    stats_.expert_tokens[expert] += offsets[l + 1] - offsets[l];
    stats_.layer_expert_tokens[at][expert] += offsets[l + 1] - offsets[l];
    stats_.expert_weight_reads[static_cast<size_t>(layer)] += offsets[l + 1] > offsets[l] ? 1 : 0;
    stats_.layer_rows[static_cast<size_t>(layer)] += offsets[l + 1] - offsets[l];
  }
  return y;
}

const ExpertPlacement& Engine::placement(int layer) const {
  EXPAR_CHECK(layer >= 0 && layer < weights_.config.layers,
              "layer {} is outside the model's {} layers: pass a layer index in [0, {})", layer,
              weights_.config.layers, weights_.config.layers);
  return placements_[static_cast<size_t>(layer)];
}

int64_t Engine::move_experts(const std::vector<LayerSlotTable>& tables) {
  EXPAR_CHECK(
      layout_.expert_parallel() && ep_,
      "moving experts needs expert parallelism (whole experts on ranks): pass --enable-expert-parallel");
  // Every table validated before any weight moves (every rank refuses alike), on the same EP degree.
  std::vector<ExpertPlacement> next;
  std::vector<bool> listed(static_cast<size_t>(weights_.config.layers), false);
  for (const LayerSlotTable& t : tables) {
    EXPAR_CHECK(t.layer >= 0 && t.layer < weights_.config.layers && !weights_.features.is_dense_mlp(t.layer),
                "an expert slot table names layer {}, which is not an MoE layer of this {}-layer model: "
                "name MoE layers only",
                t.layer, weights_.config.layers);
    EXPAR_CHECK(!listed[static_cast<size_t>(t.layer)],
                "layer {} has two expert slot tables in one move: pass one table per layer", t.layer);
    listed[static_cast<size_t>(t.layer)] = true;
    next.push_back(layout_.with_expert_slots(t.slot_experts).placement());
  }
  ExpertMoveStats moved;
  for (size_t i = 0; i < tables.size(); ++i) {
    const auto at = static_cast<size_t>(tables[i].layer);
    LayerWeights& lw = weights_.layers[at];
    lw.experts = move_expert_slots(placements_[at], next[i], lw.experts, *ep_, &moved);
    placements_[at] = std::move(next[i]);
    local_experts_[at] = placements_[at].local_experts(partition_);
    replica_deals_[at].reset();  // the layer's new replicas deal from their first
  }
  return moved.bytes_received;
}

Tensor Engine::moe_agrs(int layer, const Tensor& x, bool prefill) {
  const ModelConfig& c = weights_.config;
  const int64_t d = c.model_dim;
  // Seed 002's steps: the router on this rank's rows (prefill: its SP rows; decode: the replica's tokens,
  // which every TP rank holds and routes alike); the route map over the path's sources, whose destination
  // here is this rank's expert partition (variable EP shares it among ep_tp_size intermediate shards);
  // then moe/'s agrs path: all-gather, the partition's experts, reduce-scatter or all-reduce, in the
  // seed's order per phase (path.hpp AgrsLevel).
  MoeForwardOptions o;
  o.path = prefill ? prefill_path_.get() : decode_path_.get();
  o.partition = partition_;
  if (prefill)
    o.sources = layout_.cross_dp_ep() ? ep_.get() : tp_.get();
  else if (layout_.cross_dp_ep())
    o.sources = dp_.get();
  // else: the replica's tokens are the one source, nothing to exchange
  if (c.shared_expert_hidden > 0)
    o.before_combine = [&](const RouteMap& map, PathState& ps) {
      // The shared expert is TP-sharded: its partial sums over this replica's tokens (the sources of this
      // rank's TP group among the gathered rows) join the path's reduction over TP (level 0): in prefill
      // after the DP reduce-scatter, so a token's sums do not depend on its replica; in decode the TP
      // all-reduce comes first (seed 002), on every gathered row.
      const int64_t per_replica = prefill ? tp_->size() : 1, first = map.ep_rank / per_replica * per_replica;
      int64_t offset = 0, count = 0;
      for (int64_t s = 0; s < first + per_replica; ++s)
        (s < first ? offset : count) += map.tokens_per_source[static_cast<size_t>(s)];
      ps.agrs.combine_addend = Tensor::zeros({count, d});
      shared_expert(layer, ps.agrs.gathered_tokens.rows(offset, offset + count),
                    ps.agrs.combine_addend.data<float>());
      ps.agrs.addend_row = prefill ? 0 : offset;
      ps.agrs.addend_level = 0;
    };
  return moe_forward_counted(layer, x, o);
}

Tensor Engine::moe_decode_rowwise(int layer, const Tensor& x) {
  const ModelConfig& c = weights_.config;
  const int64_t d = c.model_dim, total = x.dim(0);
  // This rank's contiguous slice of the replica's tokens (empty when T < TP for the later ranks), routed
  // over the world and moved by the rowwise path: PUT each routed row into its owner's dispatch buffer,
  // experts on their contiguous rows, GET + merge in k order.
  const std::vector<int64_t> slice_rows = even_rows(total, tp_->size());
  const int64_t first = total * tp_rank_ / tp_->size(), mine = slice_rows[static_cast<size_t>(tp_rank_)];
  MoeForwardOptions o;
  o.path = rowwise_.get();
  o.sources = ep_.get();
  o.scratch_dispatch = true;  // no backward: the payload may live in the path's scratch slot
  Tensor y = moe_forward_counted(layer, x.rows(first, first + mine), o);
  // The shared expert is TP-sharded: its partial sums over all T tokens are reduce-scattered onto the slices
  // (the model decides, so every TP rank enters the collective even where it holds no shard).
  if (c.shared_expert_hidden > 0) {
    Tensor partial = Tensor::zeros({total, d});
    shared_expert(layer, x, partial.data<float>());
    add_into(y, reduce_scatter_rows(*tp_, partial, slice_rows, d));
  }
  return gather_rows(*tp_, y, slice_rows, d);
}

void Engine::shared_expert(int layer, const Tensor& x, float* out) const {
  const LayerWeights& lw = weights_.layers[static_cast<size_t>(layer)];
  swiglu_rows(lw.shared_w1, lw.shared_w3, lw.shared_w2, lw.shared_gate, x, out);
}

Tensor Engine::dense_mlp(int layer, const Tensor& x, bool prefill, const std::vector<int64_t>& sp_rows) {
  const LayerWeights& lw = weights_.layers[static_cast<size_t>(layer)];
  const int64_t d = weights_.config.model_dim;
  // Prefill: every SP row is gathered over TP, each rank adds its intermediate shard's partial sums, and the
  // reduce-scatter returns each rank's rows; decode: the replica's tokens are on every rank, one all-reduce.
  Tensor in = prefill ? gather_rows(*tp_, x, sp_rows, d) : x;
  Tensor partial = Tensor::zeros({in.dim(0), d});
  swiglu_rows(lw.dense_w1, lw.dense_w3, lw.dense_w2, Tensor(), in, partial.data<float>());
  if (prefill) return reduce_scatter_rows(*tp_, partial, sp_rows, d);
  tp_->all_reduce(partial.raw(), static_cast<size_t>(partial.numel()), DType::F32, ReduceOp::Sum);
  return partial;
}

}  // namespace expar::infer
