#include "expar/infer/rank_memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/rank_weights.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/model/config_tensor_store.hpp"
#include "expar/model/gpt_oss_layout.hpp"
#include "expar/model/hf_config.hpp"

namespace expar::infer {

namespace fs = std::filesystem;

namespace {

WeightFormat held_format(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return WeightFormat::BF16;
    case DType::F16:
      return WeightFormat::F16;
    default:
      return WeightFormat::F32;  // F32 as stored; anything else is widened (weight_loader.hpp)
  }
}

int64_t row_elements(const TensorInfo& info) {
  int64_t n = 1;
  for (size_t i = 1; i < info.shape.size(); ++i) n *= info.shape[i];
  return n;
}

// Mirrors weight_loader.hpp's loaders: what each allocates, in which format and category.
class Tally {
 public:
  Tally(const TensorStore& store, RankMemoryPlan& plan, std::optional<DType> weight_dtype)
      : store_(store), plan_(plan), weight_dtype_(weight_dtype) {}

  void add(WeightFormat format, int64_t bytes, MemCategory category) {
    plan_.held_bytes[static_cast<size_t>(format)] += bytes;
    (category == MemCategory::ExpertWeights ? plan_.expert_bytes : plan_.dense_bytes) += bytes;
  }
  // load_dense / load_rows: f32 copies.
  void f32_rows(const std::string& name, int64_t rows, MemCategory c = MemCategory::DenseWeights) {
    add(WeightFormat::F32, rows * row_elements(store_.info(name)) * 4, c);
  }
  void dense(const std::string& name) {
    const TensorInfo& i = store_.info(name);
    f32_rows(name, i.shape.empty() ? 1 : i.shape[0]);
  }
  // load_rows_as_stored / rows_loader_as_stored: rows held as stored (FP8 with its whole scale grid, which
  // copies keep), or widened; a product's weight (`product`) converted to --weight-dtype.
  void rows(const std::string& name, int64_t rows, MemCategory c = MemCategory::DenseWeights,
            bool product = true) {
    piece(name, rows, row_elements(store_.info(name)), c, product);
  }
  // load_columns_as_stored / columns_loader_as_stored of a 2-d [a, b]: `cols` columns of every row.
  void columns(const std::string& name, int64_t cols, MemCategory c = MemCategory::DenseWeights) {
    piece(name, store_.info(name).shape.at(0), cols, c, true);
  }
  // expert_parallel_weight_loader's stack of one piece [rows, cols] per local expert (`names`, one each),
  // each starting at row `row0` of its expert's matrix: stored FP8 pieces stack with their grids' block rows
  // where they cover whole block rows, else widen; then the stack is converted as a product's weight.
  // `stack_fp8`: whether the three matrices' stored FP8 pieces all stack (else all three widen).
  void experts(const std::vector<std::string>& names, int64_t rows, int64_t cols, bool stack_fp8) {
    if (names.empty()) return;
    const auto local = static_cast<int64_t>(names.size());
    const MemCategory c = MemCategory::ExpertWeights;
    if (stored_fp8(names[0])) {
      if (stack_fp8)
        add(WeightFormat::FP8, local * rows * cols + local * rows / kFp8Block * grid_cols(names[0]) * 4, c);
      else
        add(WeightFormat::F32, local * rows * cols * 4, c);
      return;
    }
    held_matrix(held_format(store_.info(names[0]).dtype), local * rows, cols, c, true);
  }
  // map_rows_as_stored: in place where the file is mapped and the dtype held as stored.
  void mapped_rows(const std::string& name, int64_t rows) {
    const TensorInfo& i = store_.info(name);
    if (held_as_stored(i.dtype) && store_.mapped(name))
      plan_.mapped_bytes += rows * row_elements(i) * static_cast<int64_t>(dtype_size(i.dtype));
    else
      this->rows(name, rows, MemCategory::DenseWeights, false);
  }
  // load_gpt_oss_experts_as_stored's stacked copies, in the stored dtype: of E_L experts of [E, ...], the
  // fraction `part / whole` of each.
  void stacked(const std::string& name, int64_t local_part, int64_t whole, WeightFormat format) {
    const TensorInfo& i = store_.info(name);
    add(format, local_part * row_elements(i) / whole * static_cast<int64_t>(dtype_size(i.dtype)),
        MemCategory::ExpertWeights);
  }

 private:
  bool stored_fp8(const std::string& name) const {
    return store_.info(name).dtype == DType::F8E4M3 && store_.contains(name + "_scale_inv");
  }
  int64_t grid_cols(const std::string& name) const { return store_.info(name + "_scale_inv").shape.at(1); }
  // A copied piece [rows, cols] of `name`.
  void piece(const std::string& name, int64_t rows, int64_t cols, MemCategory c, bool product) {
    if (stored_fp8(name)) {
      add(WeightFormat::FP8, rows * cols + static_cast<int64_t>(store_.info(name + "_scale_inv").nbytes()),
          c);
      return;
    }
    held_matrix(held_format(store_.info(name).dtype), rows, cols, c, product);
  }
  // A matrix [rows, cols] held in `format`, or converted by --weight-dtype when a product's weight:
  // BF16 from F32; FP8 (codes and a grid of 128 × 128 blocks) from F32, BF16 and F16.
  void held_matrix(WeightFormat format, int64_t rows, int64_t cols, MemCategory c, bool product) {
    if (product && weight_dtype_ == DType::F8E4M3 && format != WeightFormat::MXFP4) {
      add(WeightFormat::FP8,
          rows * cols + (rows + kFp8Block - 1) / kFp8Block * ((cols + kFp8Block - 1) / kFp8Block) * 4, c);
      return;
    }
    if (product && weight_dtype_ == DType::BF16 && format == WeightFormat::F32) format = WeightFormat::BF16;
    add(format, rows * cols * (format == WeightFormat::F32 ? 4 : 2), c);
  }
  const TensorStore& store_;
  RankMemoryPlan& plan_;
  std::optional<DType> weight_dtype_;
};

}  // namespace

int64_t kv_bytes_per_token(const ModelConfig& config, const ModelFeatures& features,
                           const InferenceLayout& layout, int rank) {
  if (features.mla.enabled())
    return int64_t{config.layers} * (features.mla.kv_lora_rank + features.mla.qk_rope_head_dim) *
           static_cast<int64_t>(sizeof(float));
  const HeadSplit hs = head_split(config, layout.tp(), layout.rank_info(rank).tp_rank);
  return int64_t{2} * config.layers * (hs.k1 - hs.k0) * config.head_dim * static_cast<int64_t>(sizeof(float));
}

RankMemoryPlan plan_rank_memory(const TensorStore& store, const ModelSpec& spec,
                                const InferenceLayout& layout, int rank, int64_t kv_tokens,
                                std::optional<DType> weight_dtype) {
  const ModelConfig& config = spec.config;
  const ModelFeatures& features = spec.features;
  const WeightNames names = weight_names(spec.format);
  const InferenceRankInfo info = layout.rank_info(rank);
  const HeadSplit hs = head_split(config, layout.tp(), info.tp_rank);
  const auto [i0, i1] = layout.intermediate_shard(rank, static_cast<int>(config.moe.hidden_dim));
  const int64_t hd = config.head_dim, d = config.model_dim, n = i1 - i0;
  const auto local = static_cast<int64_t>(info.local_experts.size());
  RankMemoryPlan plan;
  plan.rank = rank;
  plan.kv_tokens = kv_tokens;
  plan.kv_bytes_per_token = kv_bytes_per_token(config, features, layout, rank);
  Tally t(store, plan, weight_dtype);

  const int64_t vocab_rows =
      config.vocab * (info.tp_rank + 1) / layout.tp() - config.vocab * info.tp_rank / layout.tp();
  if (features.tied_embeddings) {
    t.rows(names.embed, vocab_rows);  // the LM head is the same copy
  } else {
    t.mapped_rows(names.embed, vocab_rows);
    t.rows(names.lm_head, vocab_rows);
  }
  t.dense(names.final_norm);
  for (int l = 0; l < config.layers; ++l) {
    auto name = [&](const char* key) { return names.layer(l, key); };
    t.dense(name("attn_norm"));
    t.dense(name("mlp_norm"));
    const LatentAttentionDims& mla = features.mla;
    if (mla.enabled()) {  // load_rank_weights' latent attention: local heads' rows, the latent's replicated
      const int64_t heads = hs.q1 - hs.q0;
      if (mla.q_lora_rank == 0) {
        t.rows(name("wq"), heads * mla.qk_head_dim());
      } else {
        t.rows(name("wq_a"), mla.q_lora_rank);
        t.dense(name("q_a_norm"));
        t.rows(name("wq_b"), heads * mla.qk_head_dim());
      }
      t.rows(name("wkv_a"), mla.kv_lora_rank + mla.qk_rope_head_dim);
      t.dense(name("kv_a_norm"));
      t.rows(name("wkv_b"), heads * (mla.qk_nope_head_dim + mla.v_head_dim));
      t.columns(name("wo"), heads * mla.v_head_dim);
    } else {
      t.rows(name("wq"), (hs.q1 - hs.q0) * hd);
      t.rows(name("wk"), (hs.k1 - hs.k0) * hd);
      t.rows(name("wv"), (hs.k1 - hs.k0) * hd);
      t.columns(name("wo"), (hs.q1 - hs.q0) * hd);
    }
    if (features.qkv_bias) {
      t.f32_rows(name("bq"), (hs.q1 - hs.q0) * hd);
      t.f32_rows(name("bk"), (hs.k1 - hs.k0) * hd);
      t.f32_rows(name("bv"), (hs.k1 - hs.k0) * hd);
    }
    if (features.o_bias && info.tp_rank == 0) t.dense(name("bo"));
    if (features.attention_sinks) t.f32_rows(name("sinks"), hs.q1 - hs.q0);
    if (features.qk_norm == QkNorm::PerHead) {
      t.dense(name("q_norm"));
      t.dense(name("k_norm"));
    } else if (features.qk_norm == QkNorm::Projection) {
      t.f32_rows(name("q_norm"), (hs.q1 - hs.q0) * hd);
      t.f32_rows(name("k_norm"), (hs.k1 - hs.k0) * hd);
    }
    if (features.is_dense_mlp(l)) {
      const auto [s0, s1] = mlp_shard(features.dense_mlp_hidden, layout.tp(), info.tp_rank);
      if (s1 > s0) {
        t.rows(names.dense(l, "w1"), s1 - s0);
        t.rows(names.dense(l, "w3"), s1 - s0);
        t.columns(names.dense(l, "w2"), s1 - s0);
      }
      continue;
    }
    t.dense(name("router"));
    if (config.moe.use_score_bias) t.dense(name("score_bias"));
    if (features.router == RouterKind::BiasedTopkSoftmax) t.dense(name("router_bias"));
    if (features.fused_experts) {
      const auto stacked = gpt_oss_expert_names(l);
      const std::string &gu = stacked[kGateUp], &dn = stacked[kDown];
      const bool quantised = store.contains(gu + "_blocks") && store.contains(dn + "_blocks");
      // load_gpt_oss_experts_as_stored's rule: MXFP4 where the shard covers whole blocks.
      if (quantised && i0 % kMxfp4Block == 0 &&
          (i1 % kMxfp4Block == 0 || i1 == store.info(dn + "_blocks").shape[2] * kMxfp4Block)) {
        // Of each local expert only the shard (n of the I intermediate rows of gate_up and of down's inputs).
        const int64_t inter = store.info(dn + "_blocks").shape[2] * kMxfp4Block;
        for (const std::string& m : {gu, dn})
          for (const char* part : {"_blocks", "_scales"})
            t.stacked(m + part, local * n, inter, WeightFormat::MXFP4);
      } else {
        t.add(WeightFormat::F32, local * 3 * n * d * 4, MemCategory::ExpertWeights);
      }
      t.add(WeightFormat::F32, local * 2 * n * 4, MemCategory::ExpertWeights);           // gate and up biases
      if (i0 == 0) t.add(WeightFormat::F32, local * d * 4, MemCategory::ExpertWeights);  // the down bias
    } else {
      std::vector<std::string> w1, w3, w2;
      for (int e : info.local_experts) {
        w1.push_back(names.expert(l, e, "w1"));
        w3.push_back(names.expert(l, e, "w3"));
        w2.push_back(names.expert(l, e, "w2"));
      }
      // Gate/up pieces start at row i0 of n rows, down's span all d rows (weight_loader.hpp's stacking rule).
      const bool stack_fp8 = i0 % kFp8Block == 0 && n % kFp8Block == 0 && d % kFp8Block == 0;
      t.experts(w1, n, d, stack_fp8);
      t.experts(w3, n, d, stack_fp8);
      t.experts(w2, d, n, stack_fp8);
    }
    if (config.shared_expert_hidden > 0) {
      const auto [s0, s1] = mlp_shard(config.shared_expert_hidden, layout.tp(), info.tp_rank);
      const int64_t share = s1 - s0;
      if (share > 0) {
        t.rows(names.shared(l, "w1"), share);
        t.rows(names.shared(l, "w3"), share);
        t.columns(names.shared(l, "w2"), share);
        if (features.shared_expert_gate) t.dense(names.shared(l, "gate"));
      }
    }
  }
  return plan;
}

bool planned_from_config(const ModelSpec& spec) {
  const fs::path& p = spec.tensor_path;
  return spec.format != ModelFormat::Expar && fs::is_directory(p) &&
         !fs::exists(p / std::string(kShardedIndexName)) && !fs::exists(p / "model.safetensors");
}

std::unique_ptr<TensorStore> open_planning_store(const ModelSpec& spec) {
  if (!planned_from_config(spec)) return open_store(spec);
  const fs::path config = spec.dir / "config.json";
  return std::make_unique<ConfigTensorStore>(
      config.string(), spec.format, spec.config, spec.features,
      stored_weights_of_config(read_hf_config_json(spec.dir), config.string()));
}

std::vector<RankMemoryPlan> plan_inference_memory(const ModelSpec& spec, const InferenceLayout& layout,
                                                  int64_t kv_tokens, std::optional<DType> weight_dtype) {
  const std::unique_ptr<TensorStore> store = open_planning_store(spec);
  std::vector<RankMemoryPlan> plans;
  for (int r = 0; r < layout.world(); ++r)
    plans.push_back(plan_rank_memory(*store, spec, layout, r, kv_tokens, weight_dtype));
  return plans;
}

std::string format_held_bytes(const RankMemoryPlan& plan) {
  std::vector<std::pair<int64_t, WeightFormat>> held;
  for (size_t f = 0; f < kWeightFormatCount; ++f)
    if (plan.held_bytes[f] > 0) held.emplace_back(plan.held_bytes[f], static_cast<WeightFormat>(f));
  std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (const auto& [bytes, format] : held)
    out += fmt::format("{}{} {}", out.empty() ? "" : " + ", weight_format_name(format), format_bytes(bytes));
  if (out.empty()) out = "none";
  if (plan.mapped_bytes > 0) out += fmt::format(" (+ mapped {})", format_bytes(plan.mapped_bytes));
  return out;
}

std::string format_rank_plans(const std::vector<RankMemoryPlan>& plans) {
  std::string out;
  for (size_t first = 0; first < plans.size();) {
    auto describe = [&](const RankMemoryPlan& p) {
      return fmt::format("{}, KV cache {} ({} positions)", format_held_bytes(p), format_bytes(p.kv_bytes()),
                         p.kv_tokens);
    };
    const std::string line = describe(plans[first]);
    size_t last = first;
    while (last + 1 < plans.size() && describe(plans[last + 1]) == line) ++last;
    out += last == first ? fmt::format("  rank {}: {}\n", plans[first].rank, line)
                         : fmt::format("  ranks {}-{}: {}\n", plans[first].rank, plans[last].rank, line);
    first = last + 1;
  }
  return out;
}

namespace {

struct ProcessNeed {
  int64_t weights = 0, kv = 0;
  int64_t total() const { return weights + kv + kInferenceReserveBytes; }
};

// The plan of the hosted ranks under `options`; nullopt when the layout itself is refused.
std::optional<ProcessNeed> need_of(const TensorStore& store, const FitRequest& r,
                                   const GenerateOptions& options, int64_t kv_tokens) {
  std::optional<InferenceLayout> layout;
  try {
    layout.emplace(inference_layout(options, r.spec->config));
  } catch (const Error&) {
    return std::nullopt;
  }
  std::vector<int> ranks = r.hosted_ranks;
  if (ranks.empty())
    for (int i = 0; i < layout->world(); ++i) ranks.push_back(i);
  ProcessNeed need;
  for (int rank : ranks) {
    if (rank >= layout->world()) return std::nullopt;
    const RankMemoryPlan p = plan_rank_memory(store, *r.spec, *layout, rank, kv_tokens, options.weight_dtype);
    need.weights += p.dense_bytes + p.expert_bytes;
    need.kv += p.kv_bytes();
  }
  return need;
}

int64_t process_limit(const FitRequest& r) {
  if (r.options.memory_limit_bytes > 0) return r.options.memory_limit_bytes;
  int64_t available = available_host_memory_bytes();
  if (!r.hosted_ranks.empty())
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
      available /= std::max(1, std::atoi(local));
  return available;
}

std::string layout_flags(const GenerateOptions& o) {
  std::string s = fmt::format("--tp {} --dp {}", o.tp, o.dp);
  if (o.enable_expert_parallel) s += " --enable-expert-parallel";
  if (o.ep_degree) s += fmt::format(" --ep {}", *o.ep_degree);
  return s;
}

// The layouts of the same ranks whose EP groups join whole DP replicas: ep_degree g * TP for every g dividing
// DP, fewest replicas per EP group first, since a smaller group exchanges fewer tokens but holds more expert
// bytes per rank (docs/inference.md, "Partial cross-DP EP"); the first that fits is the best one. g = DP is
// full EP, written as the flag's default.
std::vector<GenerateOptions> expert_parallel_layouts(const GenerateOptions& asked) {
  std::vector<GenerateOptions> layouts;
  for (int g = 1; g <= asked.dp; ++g) {
    if (asked.dp % g != 0) continue;
    GenerateOptions o = asked;
    o.enable_expert_parallel = true;
    o.ep_degree = g * asked.tp;
    if (g == asked.dp) o.ep_degree.reset();
    layouts.push_back(o);
  }
  return layouts;
}

}  // namespace

void check_fits_before_loading(const FitRequest& r) {
  EXPAR_ASSERT(r.spec != nullptr, "check_fits_before_loading needs the model spec");
  const int64_t limit = process_limit(r);
  if (limit <= 0) return;  // nothing to compare with (no /proc/meminfo)
  const std::unique_ptr<TensorStore> store = open_planning_store(*r.spec);
  const std::optional<ProcessNeed> need = need_of(*store, r, r.options, r.kv_tokens);
  if (!need || need->total() <= limit) return;  // a refused layout is reported by the loader's own checks

  // A fix that the same plan says fits: expert parallelism over the same ranks, fewer replicas, a smaller KV
  // cache.
  std::vector<std::string> fixes;
  auto fits = [&](const GenerateOptions& o, int64_t kv) {
    const auto n = need_of(*store, r, o, kv);
    return n && n->total() <= limit;
  };
  std::vector<GenerateOptions> layouts = expert_parallel_layouts(r.options);
  if (r.options.dp > 1 && r.hosted_ranks.empty()) {
    for (bool ep : {r.options.enable_expert_parallel, true}) {
      GenerateOptions o = r.options;
      o.dp = 1;
      o.enable_expert_parallel = ep;
      if (ep != r.options.enable_expert_parallel || (o.ep_degree && *o.ep_degree > o.tp)) o.ep_degree.reset();
      layouts.push_back(o);
    }
  }
  for (const GenerateOptions& o : layouts)
    if (fits(o, r.kv_tokens)) {
      fixes.push_back(fmt::format("run with {}", layout_flags(o)));
      break;
    }
  if (!r.options.weight_dtype) {  // F32 weights converted to BF16 at load
    GenerateOptions o = r.options;
    o.weight_dtype = DType::BF16;
    const auto converted = need_of(*store, r, o, r.kv_tokens);
    if (converted && converted->weights < need->weights && converted->total() <= limit)
      fixes.push_back("pass --weight-dtype bf16");
  }
  if (r.kv_fix && need->weights + kInferenceReserveBytes < limit && need->kv > 0) {
    // The most positions per rank that fit beside the weights.
    const int64_t per_token = need->kv / r.kv_tokens;
    const int64_t tokens = (limit - need->weights - kInferenceReserveBytes) / per_token;
    if (tokens >= 1 && fits(r.options, tokens))
      if (const auto flag = r.kv_fix(tokens)) fixes.push_back(fmt::format("pass {}", *flag));
  }
  const std::string ranks = r.hosted_ranks.empty() ? fmt::format("its {} ranks", r.options.tp * r.options.dp)
                                                   : fmt::format("rank {}", r.hosted_ranks.front());
  throw Error(fmt::format(
      "the model at '{}' does not fit: this process would hold {} for {} (weights {}, KV cache {} for {} "
      "positions per rank, {} kept free for activations) but has {} available{}; {}",
      r.spec->dir.string(), format_bytes(need->total()), ranks, format_bytes(need->weights),
      format_bytes(need->kv), r.kv_tokens, format_bytes(kInferenceReserveBytes), format_bytes(limit),
      r.options.memory_limit_bytes > 0 ? " (--memory-limit-gib)" : "",
      fixes.empty() ? "no layout of this process holds it: serve it over several machines (expar serve "
                      "--transport mpi under mpirun), or use one with more memory"
                    : fmt::format("to fit, {}", fmt::join(fixes, ", or "))));
}

}  // namespace expar::infer
