#include "expar/bench/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "expar/bench/measure.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"
#include "expar/core/product_precision.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/weight_view.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/rank_memory_plan.hpp"
#include "expar/moe/router_skew.hpp"
#include "expar/serve/expert_rebalancer.hpp"
#include "expar/topo/expert_balance.hpp"

namespace expar::bench {

namespace {

struct Gemm {
  int64_t m, n, k;
  const float* b;      // [n, k] (trans_b), or nullptr: a scratch operand
  double flops_scale;  // 0.5 for the causal attention products
  // Products the engine spreads over the compute threads as tasks (core/parallel_tasks: the heads, the
  // experts): consecutive products of one group >= 0 run through for_each_task, one task per run of equal
  // `task`, each product on its worker's thread. -1: a product alone on all threads.
  int group = -1;
  int64_t task = 0;
  // A BF16 weight multiplied as held in oneDNN's BF16 matmul (ProductPrecision::BF16: what the engine runs),
  // against BF16 activations; nullptr: the f32 product above.
  const uint16_t* b16 = nullptr;
};

// The f32 weights of a limit product: the weight itself where it is held as f32, else nullptr (an f32 scratch
// of its shape: the limit is the f32 product's).
const float* f32_or_scratch(const Tensor& t, int64_t offset = 0) {
  return infer::present(t) && t.dtype() == DType::F32 ? t.data<float>() + offset : nullptr;
}

// A product over a held weight at the precision the engine multiplies it (the calling thread's
// ProductPrecision): a BF16 weight under BF16 precision as it is, in oneDNN's BF16 matmul; otherwise the f32
// product (f32_or_scratch).
Gemm weight_gemm(int64_t m, int64_t n, int64_t k, const Tensor& t, int64_t offset = 0, int group = -1,
                 int64_t task = 0) {
  Gemm g{m, n, k, f32_or_scratch(t, offset), 1.0, group, task};
  if (infer::present(t) && t.dtype() == DType::BF16 && product_precision() == ProductPrecision::BF16)
    g.b16 = static_cast<const uint16_t*>(t.raw()) + offset;
  return g;
}

// A SwiGLU MLP's three products over m rows (w1, w3 [h, d], w2 [d, h]; the shared expert, a dense layer).
void swiglu_gemms(std::vector<Gemm>& g, int64_t m, const Tensor& w1, const Tensor& w3, const Tensor& w2) {
  if (!infer::present(w1)) return;
  const int64_t h = w1.dim(0), d = w1.dim(1);
  g.push_back(weight_gemm(m, h, d, w1));
  g.push_back(weight_gemm(m, h, d, w3));
  g.push_back(weight_gemm(m, d, h, w2));
}

// Latent attention's products of a P-token prefill in the expanded form (the engine's prefill): the query
// (through the q LoRA), the latent, its expansion into each local head's key and value parts, the causal
// attention at widths nope + rope and v, and the output.
void latent_attention_gemms(std::vector<Gemm>& g, const infer::RankWeights& w, const infer::LayerWeights& lw,
                            int64_t p) {
  const nn::LatentAttentionShape& s = w.local_latent;
  const int64_t d = w.config.model_dim;
  if (s.q_lora_rank > 0) {
    g.push_back(weight_gemm(p, s.q_lora_rank, d, lw.mla.wq_a));
    g.push_back(weight_gemm(p, s.q_width(), s.q_lora_rank, lw.mla.wq_b));
  } else {
    g.push_back(weight_gemm(p, s.q_width(), d, lw.mla.wq));
  }
  g.push_back(weight_gemm(p, s.kv_a_width(), d, lw.mla.wkv_a));
  g.push_back(weight_gemm(p, s.kv_b_width(), s.kv_lora_rank, lw.mla.wkv_b));
  for (int64_t h = 0; h < s.n_heads; ++h) {
    g.push_back({p, p, s.qk_head_dim(), nullptr, 0.5, 0, h});  // scores q·kᵀ, causal
    g.push_back({p, s.v_head_dim, p, nullptr, 0.5, 0, h});     // probabilities · v, causal
  }
  g.push_back(weight_gemm(p, d, s.context_width(), lw.mla.wo));
}

// This rank's matrix products of layer `layer` of a P-token prefill, at the shapes the engine runs them.
std::vector<Gemm> layer_gemms(const infer::RankWeights& w, const InferenceLayout& layout, int64_t p,
                              int layer) {
  const ModelConfig& c = w.config;
  const infer::LayerWeights& lw = w.layers[static_cast<size_t>(layer)];
  const int64_t d = c.model_dim, hd = c.head_dim, heads = w.local_attn.n_heads, kv = w.local_attn.n_kv_heads;
  std::vector<Gemm> g;
  if (w.features.mla.enabled()) {
    latent_attention_gemms(g, w, lw, p);
  } else {
    g.push_back(weight_gemm(p, heads * hd, d, lw.attn.wq));
    g.push_back(weight_gemm(p, kv * hd, d, lw.attn.wk));
    g.push_back(weight_gemm(p, kv * hd, d, lw.attn.wv));
    for (int64_t h = 0; h < heads; ++h) {
      g.push_back({p, p, hd, nullptr, 0.5, 0, h});  // scores q·kᵀ, causal
      g.push_back({p, hd, p, nullptr, 0.5, 0, h});  // probabilities · v, causal
    }
    g.push_back(weight_gemm(p, d, heads * hd, lw.attn.wo));
  }
  if (w.features.is_dense_mlp(layer)) {  // every token through this rank's shard of the dense MLP
    swiglu_gemms(g, p, lw.dense_w1, lw.dense_w3, lw.dense_w2);
    return g;
  }
  g.push_back(
      {(p + layout.tp() - 1) / layout.tp(), c.moe.router.num_experts, d, lw.router.data<float>(), 1.0});
  // Each local expert slot at the mean rows the replica's P tokens give it (P·K/S over the S expert slots,
  // S = E without redundant experts; with cross-DP EP the tokens of the EP group's replicas meet at its
  // experts).
  const int64_t replicas = layout.ep_dp_size();
  const int64_t rows =
      std::max<int64_t>(1, p * replicas * c.moe.router.top_k / layout.placement().num_slots());
  const ExpertWeights& e = lw.experts;
  const int64_t h = e.hidden();
  for (int64_t l = 0; l < e.local_count() && h > 0; ++l) {
    g.push_back(weight_gemm(rows, h, d, e.w1, l * h * d, 1, l));
    g.push_back(weight_gemm(rows, h, d, e.w3, l * h * d, 1, l));
    g.push_back(weight_gemm(rows, d, h, e.w2, l * d * h, 1, l));
  }
  swiglu_gemms(g, p, lw.shared_w1, lw.shared_w3, lw.shared_w2);
  return g;
}

// The products in order as the engine runs them: alone on all threads, or a group's tasks spread over the
// threads (each worker writing its own c_size floats of c).
void run_products(const std::vector<Gemm>& gemms, const Tensor& a, const Tensor& a16, const Tensor& b,
                  Tensor& c, int64_t c_size) {
  auto product = [&](const Gemm& g, float* out) {
    if (g.b16 != nullptr) {
      matmul_bf16({.a = static_cast<const uint16_t*>(a16.raw()),
                   .b = g.b16,
                   .c = out,
                   .m = g.m,
                   .n = g.n,
                   .k = g.k,
                   .trans_b = true});
      return;
    }
    matmul(a.data<float>(), g.b ? g.b : b.data<float>(), out, g.m, g.n, g.k, false, true, false);
  };
  for (size_t i = 0; i < gemms.size();) {
    if (gemms[i].group < 0) {
      product(gemms[i++], c.data<float>());
      continue;
    }
    size_t end = i;
    std::vector<size_t> starts;
    for (; end < gemms.size() && gemms[end].group == gemms[i].group; ++end)
      if (end == i || gemms[end].task != gemms[end - 1].task) starts.push_back(end);
    starts.push_back(end);
    for_each_task(static_cast<int64_t>(starts.size()) - 1, [&](int64_t t, int thread) {
      for (size_t k = starts[static_cast<size_t>(t)]; k < starts[static_cast<size_t>(t) + 1]; ++k)
        product(gemms[k], c.data<float>() + thread * c_size);
    });
    i = end;
  }
}

double gemm_flops(const std::vector<Gemm>& g) {
  double f = 0;
  for (const Gemm& x : g)
    f += 2.0 * static_cast<double>(x.m) * static_cast<double>(x.n) * static_cast<double>(x.k) * x.flops_scale;
  return f;
}

// Bytes a batch-1 decode step at position `length` reads on this rank: every dense weight it holds (the
// embedding only one row), its LM head slice and its KV cache (`dense`), and the weights of the local
// experts the step routes to: `per_expert` bytes each (one layer's local expert), `expected_experts` of them
// on average (K·S_L/S per layer: S_L of the S expert slots, S = E without redundant experts).
struct DecodeBytes {
  double dense = 0.0, per_expert = 0.0, expected_experts = 0.0;
  double expected() const { return dense + per_expert * expected_experts; }
};

DecodeBytes decode_bytes(const infer::RankWeights& w, int64_t length, int num_slots) {
  const ModelConfig& c = w.config;
  auto b = [](const Tensor& t) { return infer::present(t) ? static_cast<double>(t.nbytes()) : 0.0; };
  DecodeBytes r;
  double& bytes = r.dense;
  bytes = b(w.final_norm) + b(w.lm_head) + static_cast<double>(c.model_dim) * sizeof(float);
  const nn::LatentAttentionShape& s = w.local_latent;
  for (const infer::LayerWeights& lw : w.layers) {
    bytes += b(lw.attn_norm) + b(lw.mlp_norm) + b(lw.attn.wq) + b(lw.attn.wk) + b(lw.attn.wv) + b(lw.attn.wo);
    bytes += b(lw.attn_options.bq) + b(lw.attn_options.bk) + b(lw.attn_options.bv) + b(lw.attn_options.bo);
    for (const Tensor* t :
         {&lw.mla.wq, &lw.mla.wq_a, &lw.mla.q_a_norm, &lw.mla.wq_b, &lw.mla.wkv_a, &lw.mla.kv_a_norm,
          &lw.mla.wkv_b, &lw.mla.wo, &lw.dense_w1, &lw.dense_w3, &lw.dense_w2})
      bytes += b(*t);
    bytes += b(lw.router) + b(lw.score_bias) + b(lw.router_bias);
    bytes += b(lw.shared_w1) + b(lw.shared_w3) + b(lw.shared_w2) + b(lw.shared_gate);
    // The cache a step reads: the latent rows (latent attention), or each key/value head's keys and values.
    bytes += w.features.mla.enabled()
                 ? static_cast<double>(length * s.kv_a_width()) * sizeof(float)
                 : 2.0 * static_cast<double>(length * w.local_attn.n_kv_heads * w.local_attn.head_dim) *
                       sizeof(float);
    if (!infer::present(lw.experts.w1) && !lw.experts.mxfp4) continue;  // a dense layer
    const auto experts = static_cast<double>(lw.experts.bytes());
    // S_L local expert slots, each active with probability K/S for one token.
    const auto local = static_cast<double>(lw.experts.local_count());
    if (local > 0) r.per_expert = experts / local;
    r.expected_experts += local * static_cast<double>(c.moe.router.top_k) / static_cast<double>(num_slots);
  }
  return r;
}

int64_t held_bytes(const infer::RankWeights& w) {
  int64_t bytes = weight_bytes(w.embed) + weight_bytes(w.final_norm) +
                  (w.lm_head.raw() == w.embed.raw() ? 0 : weight_bytes(w.lm_head));
  for (const infer::LayerWeights& lw : w.layers) bytes += infer::layer_bytes(lw);
  return bytes;
}

// Streaming read of `n` floats with this rank's compute threads; returns their sum so nothing is elided.
float read_all(const float* p, int64_t n) {
  float total = 0.0f;
#pragma omp parallel for simd reduction(+ : total) schedule(static)
  for (int64_t i = 0; i < n; ++i) total += p[i];
  return total;
}

// A random prompt of `length` tokens below `vocab`, one per stream.
std::vector<int32_t> random_prompt(int64_t length, int vocab, uint64_t seed, uint64_t stream) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>(random_u32(seed, stream, i) % static_cast<uint32_t>(vocab));
  return prompt;
}

// Every MoE router's logit bias plus the skew of its layer (the same on every rank: a function of s, E, the
// seed and the layer; each layer's hottest experts are others).
void skew_routers(infer::RankWeights& w, double exponent, uint64_t seed) {
  for (size_t l = 0; l < w.layers.size(); ++l)
    if (infer::present(w.layers[l].router))
      add_router_skew(w.layers[l].router_bias, exponent, static_cast<int>(w.config.moe.router.num_experts),
                      seed, static_cast<int>(l));
}

}  // namespace

GenerateBenchReport run_generate_bench(const GenerateBenchOptions& o) {
  EXPAR_CHECK(!o.path.empty(), "a model is needed: pass --checkpoint <dir or file>");
  EXPAR_CHECK(o.prompt_tokens >= 1, "--prompt-tokens {} must be at least 1", o.prompt_tokens);
  EXPAR_CHECK(o.tokens >= 2, "--tokens {} must be at least 2 (one from the prefill, then decode steps)",
              o.tokens);
  EXPAR_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats {} must be >= 1 and --warmup {} >= 0", o.repeats,
              o.warmup);
  EXPAR_CHECK(o.eplb_prompts >= 1,
              "--eplb-prompts {} must be at least 1 (the untimed prompts whose loads place the replicas)",
              o.eplb_prompts);
  const infer::ModelSpec spec = infer::open_model_spec(o.path, o.engine.format);
  const ModelConfig& config = spec.config;
  EXPAR_CHECK(o.prompt_tokens + o.tokens <= config.max_seq,
              "--prompt-tokens {} + --tokens {} exceed the model's max_seq {}: shorten them", o.prompt_tokens,
              o.tokens, config.max_seq);
  const InferenceLayout layout = infer::inference_layout(o.engine, config);
  infer::check_decode_moe(layout, o.engine.decode_moe);
  infer::FitRequest fit;
  fit.spec = &spec;
  fit.options = o.engine;
  fit.kv_tokens = o.prompt_tokens + o.tokens;
  fit.kv_fix = [&](int64_t positions) -> std::optional<std::string> {
    if (positions < o.prompt_tokens + 2) return std::nullopt;
    return fmt::format("--tokens {}", positions - o.prompt_tokens);
  };
  infer::check_fits_before_loading(fit);
  check_router_skew(o.router_skew);
  const std::vector<int32_t> prompt = random_prompt(o.prompt_tokens, config.vocab, o.seed, 0x6E4);

  GenerateBenchReport r;
  r.ranks = layout.world();
  r.ep_degree = layout.ep_degree();
  r.threads = o.engine.compute_threads;
  std::mutex mutex;
  LaunchOptions launch;
  launch.ranks = layout.world();
  launch.compute_threads = o.engine.compute_threads;
  r.memory.resize(static_cast<size_t>(layout.world()));
  run_ranks(launch, [&](Comm& world) {
    infer::Engine engine(
        layout, world,
        [&] {
          std::unique_ptr<TensorStore> store = infer::open_store(spec);
          infer::RankWeights w =
              infer::load_rank_weights(*store, spec, layout, world.rank(), o.engine.weight_dtype);
          if (o.router_skew > 0) skew_routers(w, o.router_skew, o.seed);
          return w;
        }(),
        infer::engine_options_for(o.engine));
    // One run: every replica prefills the same prompt and decodes greedily; seconds of prefill and of
    // the decode steps (slowest rank). `between`, when given, runs after each decode step outside its
    // timing (the read probe of the bandwidth limit); the sum of the seconds it returns comes back third.
    // Per decode step of the last run and per layer ([step][layer]): how many local experts' weights this
    // rank read.
    const size_t layers = static_cast<size_t>(config.layers);
    std::vector<double> step_experts(static_cast<size_t>(o.tokens - 1) * layers);
    // The rows this rank's experts computed per layer in the last run's prefill and decode steps.
    std::vector<int64_t> prefill_rows(layers), decode_rows(layers);
    auto run = [&](const std::vector<int32_t>& tokens, const std::function<double()>& between) {
      const int id = engine.add_sequence(o.prompt_tokens + o.tokens);
      Tensor logits;
      const std::vector<int64_t> rows_before = engine.stats().layer_rows;
      const double tp = timed_max(world, [&] {
        logits = engine.prefill(std::vector<int>{id}, {tokens}, infer::PrefillLogits::LastRow);
      });
      const std::vector<int64_t> rows_prefilled = engine.stats().layer_rows;
      int32_t next = infer::argmax_row(logits, 0);
      double td = 0.0, tb = 0.0;
      for (int s = 1; s < o.tokens; ++s) {
        const std::vector<int64_t> before = engine.stats().expert_weight_reads;
        td += timed_max(world, [&] {
          next = infer::argmax_row(engine.decode(std::vector<int>{id}, std::vector<int32_t>{next}), 0);
        });
        for (size_t l = 0; l < layers; ++l)
          step_experts[static_cast<size_t>(s - 1) * layers + l] =
              static_cast<double>(engine.stats().expert_weight_reads[l] - before[l]);
        if (between) tb += between();
      }
      for (size_t l = 0; l < layers; ++l) {
        prefill_rows[l] = rows_prefilled[l] - rows_before[l];
        decode_rows[l] = engine.stats().layer_rows[l] - rows_prefilled[l];
      }
      engine.remove_sequence(id);
      return std::tuple{tp, td, tb};
    };
    if (layout.placement().has_replicas()) {
      // EPLB as a server runs it (serve/expert_rebalancer.hpp): each layer's loads of runs on other prompts
      // of the same length choose that layer's placement, and the engine moves its expert weights there. One
      // prompt's loads predict another's poorly (each layer's hot experts move with the prompt), so the
      // window holds several, as a server's does.
      const std::vector<std::vector<int64_t>> before = engine.stats().layer_expert_tokens;
      for (int p = 0; p < o.eplb_prompts; ++p)
        run(random_prompt(o.prompt_tokens, config.vocab, o.seed, 0x6E5 + static_cast<uint64_t>(p)), {});
      serve::StepLoad load;
      load.layer_expert_tokens = engine.stats().layer_expert_tokens;
      for (size_t l = 0; l < layers; ++l) {
        std::vector<int64_t>& loads = load.layer_expert_tokens[l];
        for (size_t e = 0; e < loads.size(); ++e) loads[e] -= before[l][e];
        world.all_reduce(std::span<int64_t>(loads), ReduceOp::Sum);
      }
      serve::ExpertRebalancer rebalancer({.window = 1, .interval = 1}, layout.placement(), config.layers);
      rebalancer.after_step(load);
      const std::vector<LayerSlotTable> tables = rebalancer.before_step();
      if (!tables.empty()) {
        int64_t bytes = 0;
        const double seconds = timed_max(world, [&] { bytes = engine.move_experts(tables); });
        world.all_reduce(&bytes, 1, DType::I64, ReduceOp::Sum);
        std::lock_guard lock(mutex);
        r.rebalanced = true;
        r.moved_layers = static_cast<int>(tables.size());
        r.moved_bytes = bytes;
        r.move_seconds = seconds;
      }
    }
    run(prompt, {});  // untimed: the memory figures below include a whole run
    {  // before the limits' buffers: the engine's bytes (current: the weights; peak: loading, KV cache)
      std::lock_guard lock(mutex);
      r.memory[static_cast<size_t>(world.rank())] = current_tracker().snapshot();
    }
    world.barrier();
    if (world.rank() == 0) r.peak_rss_bytes = peak_resident_bytes();  // before the limits' buffers too
    // The limits, on the same ranks with the same threads, all ranks at once, at the engine's precision.
    const ScopedProductPrecision precision(o.engine.precision);
    const infer::RankWeights& w = engine.weights();
    std::vector<std::vector<Gemm>> gemms;  // per layer
    for (int l = 0; l < config.layers; ++l) gemms.push_back(layer_gemms(w, layout, o.prompt_tokens, l));
    const Gemm head = weight_gemm(1, w.lm_head.dim(0), config.model_dim, w.lm_head);
    // The operands fit every product, the LM head's too (its output row outgrows short prompts' products).
    int64_t a_size = 0, c_size = 0, b_size = 0;
    double flops = gemm_flops({head});
    for (const std::vector<Gemm>& layer : gemms) {
      flops += gemm_flops(layer);
      for (const Gemm& g : layer) {
        a_size = std::max(a_size, g.m * g.k);
        c_size = std::max(c_size, g.m * g.n);
        if (!g.b) b_size = std::max(b_size, g.n * g.k);
      }
    }
    a_size = std::max(a_size, head.m * head.k);
    c_size = std::max(c_size, head.m * head.n);
    // A head held in a narrow format is multiplied from an f32 scratch (the limit products do not read stored
    // formats yet) in slices of at most 256 MiB of rows, far beyond the caches: gpt-oss-20b's vocabulary
    // would otherwise need 2.3 GB of scratch beside the model.
    const int64_t head_rows =
        head.b || head.b16
            ? head.n
            : std::clamp<int64_t>((int64_t{256} << 20) / (head.k * static_cast<int64_t>(sizeof(float))), 1,
                                  head.n);
    if (!head.b && !head.b16) b_size = std::max(b_size, head_rows * head.k);
    Tensor a = Tensor::empty({a_size}, DType::F32, MemCategory::Other);
    Tensor b = Tensor::empty({std::max<int64_t>(b_size, 1)}, DType::F32, MemCategory::Other);
    // One output per worker: the task groups' products run side by side.
    Tensor c = Tensor::empty({c_size * task_threads(std::numeric_limits<int64_t>::max())}, DType::F32,
                             MemCategory::Other);
    fill_normal(a, o.seed, 9101, 1.0f);
    // The BF16 products' activations: a's first values rounded (only where a product multiplies BF16).
    const bool any_bf16 =
        head.b16 != nullptr || std::any_of(gemms.begin(), gemms.end(), [](const auto& layer) {
          return std::any_of(layer.begin(), layer.end(), [](const Gemm& g) { return g.b16; });
        });
    Tensor a16 = Tensor::empty({any_bf16 ? a_size : 1}, DType::BF16, MemCategory::Other);
    if (any_bf16)
      round_rows_to_bf16(a.data<float>(), a_size, static_cast<uint16_t*>(a16.raw()), a_size, 1, a_size);
    fill_normal(b, o.seed, 9102, 1.0f);
    // Streaming read bandwidth, each rank through a buffer of max(256 MiB, 1 GiB / ranks): far beyond what
    // the caches hold. On a VM whose share of a large L3 is not fixed, smaller buffers read partly from the
    // cache and overstate the limit (docs/performance.md, "`expar bench generate`").
    // The probe reads, after every decode step, as many bytes as a step reads (the expected bytes, at
    // most the buffer), through the buffer in turn: the limit is sampled at the same moments as the
    // steps, so the machine's speed drifting within a run (the same products read at very different rates
    // a few seconds apart) moves both alike.
    const DecodeBytes step_bytes =
        decode_bytes(w, o.prompt_tokens + o.tokens / 2, layout.placement().num_slots());
    const int64_t read_bytes = std::max<int64_t>(int64_t{256} << 20, (int64_t{1} << 30) / world.size());
    const int64_t floats = read_bytes / static_cast<int64_t>(sizeof(float));
    // The largest rank's step bytes, read by every rank: the bandwidth below is then one figure for all.
    double maxima[2] = {flops, step_bytes.expected()};
    world.all_reduce(maxima, 2, DType::F64, ReduceOp::Max);
    const int64_t window =
        std::clamp<int64_t>(static_cast<int64_t>(maxima[1]) / static_cast<int64_t>(sizeof(float)), 1, floats);
    Tensor buffer = Tensor::empty({floats}, DType::F32, MemCategory::Other);
    buffer.fill(1.0f);
    volatile float sink = 0.0f;
    int64_t offset = 0;
    auto read_probe = [&] {
      if (offset + window > floats) offset = 0;
      const float* p = buffer.data<float>() + offset;
      offset += window;
      return timed_max(world, [&] { sink = sink + read_all(p, window); });
    };
    // Each repeat measures the run (with the read probe between its decode steps) and the prefill limit
    // back to back, so a change in the machine's load between repeats moves them together (the fractions
    // are their medians' ratios).
    std::vector<double> prefill, decode, limit, read;
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      const auto [tp, td, tr] = run(prompt, read_probe);
      const double tl = timed_max(world, [&] {
        for (const std::vector<Gemm>& layer : gemms) run_products(layer, a, a16, b, c, c_size);
        if (head.b16 != nullptr) return run_products({head}, a, a16, b, c, c_size);
        for (int64_t r0 = 0; r0 < head.n; r0 += head_rows)
          matmul(a.data<float>(), head.b ? head.b + r0 * head.k : b.data<float>(), c.data<float>() + r0,
                 head.m, std::min(head_rows, head.n - r0), head.k, false, true, false);
      });
      if (i < o.warmup) continue;
      prefill.push_back(tp);
      decode.push_back(td / static_cast<double>(o.tokens - 1));
      limit.push_back(tl);
      read.push_back(tr / static_cast<double>(o.tokens - 1));
    }
    // The routes the run took: per step, the dense bytes plus, layer by layer, the experts of the layer's
    // busiest rank (every MoE layer ends in a collective, so the others wait for it there), averaged over
    // the steps. At batch 1 the K experts may all sit on one rank (EP), which then reads more than its
    // expected share. Taking the busiest rank of the whole step instead would let one layer's idle rank
    // make up for another's and understate the bound.
    world.all_reduce(step_experts.data(), step_experts.size(), DType::F64, ReduceOp::Max);
    const size_t steps = static_cast<size_t>(o.tokens - 1);
    double routed_mean = 0.0;
    for (size_t s = 0; s < steps; ++s) {
      double experts = 0.0;
      for (size_t l = 0; l < layers; ++l) experts += step_experts[s * layers + l];
      routed_mean += (step_bytes.dense + step_bytes.per_expert * experts) / static_cast<double>(steps);
    }
    world.all_reduce(&routed_mean, 1, DType::F64, ReduceOp::Max);
    // Every rank's rows per layer, [rank][layer], for the imbalance of the last timed run.
    std::vector<double> all_rows(static_cast<size_t>(2 * world.size()) * layers, 0.0);
    for (size_t l = 0; l < layers; ++l) {
      all_rows[static_cast<size_t>(world.rank()) * layers + l] = static_cast<double>(prefill_rows[l]);
      all_rows[static_cast<size_t>(world.size() + world.rank()) * layers + l] =
          static_cast<double>(decode_rows[l]);
    }
    world.all_reduce(all_rows.data(), all_rows.size(), DType::F64, ReduceOp::Sum);
    std::vector<std::vector<double>> prefill_by_rank, decode_by_rank;
    for (int k = 0; k < 2 * world.size(); ++k)
      (k < world.size() ? prefill_by_rank : decode_by_rank)
          .emplace_back(all_rows.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(k) * layers),
                        all_rows.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(k + 1) * layers));
    double held_total = static_cast<double>(held_bytes(w));
    world.all_reduce(&held_total, 1, DType::F64, ReduceOp::Sum);
    if (world.rank() == 0) {
      std::lock_guard lock(mutex);
      r.prefill_seconds = median(prefill);
      r.decode_seconds_per_token = median(decode);
      r.prefill_limit_seconds = median(limit);
      r.prefill_flops = maxima[0];
      r.decode_bytes_per_token = maxima[1];
      r.decode_routed_bytes_per_token = routed_mean;
      r.read_bandwidth = static_cast<double>(window) * sizeof(float) / median(read);
      r.weight_bytes = static_cast<int64_t>(held_total);
      const LayerImbalance prefill_load = layer_imbalance(prefill_by_rank);
      const LayerImbalance decode_load = layer_imbalance(decode_by_rank);
      r.prefill_imbalance = prefill_load.mean;
      r.prefill_imbalance_max = prefill_load.largest;
      r.decode_imbalance = decode_load.mean;
      r.decode_imbalance_max = decode_load.largest;
      r.kv_bytes_per_token = infer::kv_bytes_per_token(config, spec.features, layout, 0);
      if (spec.features.mla.enabled())
        r.kv_bytes_per_token_expanded = int64_t{config.layers} * w.local_latent.n_heads *
                                        (w.local_latent.qk_head_dim() + w.local_latent.v_head_dim) *
                                        static_cast<int64_t>(sizeof(float));
    }
  });
  r.prefill_tokens_per_s = static_cast<double>(o.prompt_tokens) / r.prefill_seconds;
  r.decode_tokens_per_s = 1.0 / r.decode_seconds_per_token;
  r.matmul_flops = r.prefill_flops / r.prefill_limit_seconds;
  r.prefill_matmul_fraction = r.prefill_limit_seconds / r.prefill_seconds;
  r.decode_bandwidth_fraction = r.decode_tokens_per_s / (r.read_bandwidth / r.decode_bytes_per_token);
  r.decode_routed_fraction = r.decode_tokens_per_s / (r.read_bandwidth / r.decode_routed_bytes_per_token);
  return r;
}

std::string generate_bench_json(const GenerateBenchOptions& o, const GenerateBenchReport& r) {
  nlohmann::json memory = nlohmann::json::array();
  for (const MemorySnapshot& s : r.memory) {
    nlohmann::json rank = nlohmann::json::object();
    for (size_t c = 0; c < kNumMemCategories; ++c)
      if (s.peak[c] != 0)
        rank[std::string(mem_category_name(static_cast<MemCategory>(c)))] = {{"current", s.current[c]},
                                                                             {"peak", s.peak[c]}};
    rank["total"] = {{"current", s.total_current}, {"peak", s.total_peak}};
    memory.push_back(rank);
  }
  const nlohmann::json j{{"path", o.path},
                         {"tp", o.engine.tp},
                         {"dp", o.engine.dp},
                         {"enable_expert_parallel", o.engine.enable_expert_parallel},
                         {"ep_degree", r.ep_degree},
                         {"threads", r.threads},
                         {"precision", product_precision_name(o.engine.precision)},
                         {"prompt_tokens", o.prompt_tokens},
                         {"tokens", o.tokens},
                         {"prefill_tokens_per_s", r.prefill_tokens_per_s},
                         {"decode_tokens_per_s", r.decode_tokens_per_s},
                         {"prefill_matmul_fraction", r.prefill_matmul_fraction},
                         {"decode_bandwidth_fraction", r.decode_bandwidth_fraction},
                         {"decode_routed_fraction", r.decode_routed_fraction},
                         {"prefill_seconds", r.prefill_seconds},
                         {"prefill_limit_seconds", r.prefill_limit_seconds},
                         {"prefill_flops_busiest_rank", r.prefill_flops},
                         {"matmul_flops_per_s", r.matmul_flops},
                         {"read_bandwidth_bytes_per_s", r.read_bandwidth},
                         {"decode_bytes_per_token_busiest_rank", r.decode_bytes_per_token},
                         {"decode_routed_bytes_per_token_busiest_rank", r.decode_routed_bytes_per_token},
                         {"weight_bytes_all_ranks", r.weight_bytes},
                         {"kv_bytes_per_token_rank0", r.kv_bytes_per_token},
                         {"kv_bytes_per_token_expanded_rank0", r.kv_bytes_per_token_expanded},
                         {"peak_rss_bytes", r.peak_rss_bytes},
                         {"router_skew", o.router_skew},
                         {"redundant_experts", o.engine.redundant_experts},
                         {"eplb_prompts", o.eplb_prompts},
                         {"rank_load_imbalance_prefill", r.prefill_imbalance},
                         {"rank_load_imbalance_prefill_max_layer", r.prefill_imbalance_max},
                         {"rank_load_imbalance_decode", r.decode_imbalance},
                         {"rank_load_imbalance_decode_max_layer", r.decode_imbalance_max},
                         {"rebalanced", r.rebalanced},
                         {"expert_moved_layers", r.moved_layers},
                         {"expert_move_bytes_all_ranks", r.moved_bytes},
                         {"expert_move_seconds", r.move_seconds},
                         {"memory_per_rank", memory}};
  return j.dump(2) + "\n";
}

}  // namespace expar::bench
