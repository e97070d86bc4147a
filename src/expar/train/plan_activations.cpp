#include "expar/train/plan_activations.hpp"

#include <algorithm>

#include "expar/core/error.hpp"
#include "expar/model/model_shape.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/moe/expert_mlp.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar {

namespace {

constexpr int64_t kF32 = 4, kI32 = 4;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

SavedActivations saved_activations(const ActivationPlanInputs& in, const ExpertPlacement& placement) {
  const ModelShape& m = in.model;
  EXPAR_CHECK(in.cp >= 1 && in.tp >= 1, "context parallel {} and tensor parallel {} must be at least 1",
              in.cp, in.tp);
  EXPAR_CHECK(in.seq_len >= in.cp && in.seq_len % in.cp == 0,
              "--seq-len {} is not a multiple of the context-parallel degree {}: each rank holds a chunk of "
              "S/C tokens; pass --seq-len {}",
              in.seq_len, in.cp, std::max<int64_t>(in.cp, in.seq_len / in.cp * in.cp));
  const int64_t chunk = in.seq_len / in.cp;
  EXPAR_CHECK(in.tokens >= chunk && in.tokens % chunk == 0,
              "--tokens {} per rank is not a whole number of sequence chunks of --seq-len {} / C {} = {} "
              "tokens: pass --tokens {}",
              in.tokens, in.seq_len, in.cp, chunk, std::max<int64_t>(chunk, in.tokens / chunk * chunk));
  const bool known_path = in.path == "local" || in.path == "block" || in.path == "rowwise" ||
                          in.path == "aggregated" || in.path == "agrs";
  EXPAR_CHECK(known_path,
              "--path {}: the saved activations are planned for the training paths local, block, rowwise, "
              "aggregated and agrs; pass one of them",
              in.path);
  EXPAR_CHECK(in.recomputed_moe_layers >= 0 && in.recomputed_moe_layers <= in.moe_layers,
              "{} recomputed MoE layers of a stage with {}: recompute between 0 and {}",
              in.recomputed_moe_layers, in.moe_layers, in.moe_layers);

  {
    // Every figure is an int64 count: bound the largest products in long double first, so that a huge input
    // is an error instead of wrapped byte counts.
    using ld = long double;
    const ld n = ld(in.tokens), layers = ld(std::max(in.layers, 1));
    const ld width =
        std::max<ld>({ld(m.d_model), ld(m.heads) * std::max(m.head_dim, m.v_head_dim + 256),
                      ld(m.expert_hidden), ld(m.dense_hidden), ld(m.shared_hidden) * m.shared_experts,
                      ld(m.vocab), ld(m.num_experts), ld(m.kv_lora_rank) + m.q_lora_rank});
    const ld per_layer = n * (ld(m.heads) * in.seq_len + 64 * width + ld(m.top_k) * 64 * m.d_model) * 8 +
                         ld(placement.ep_size()) * n * m.top_k * (ld(m.expert_hidden) + m.d_model) * 16;
    EXPAR_CHECK(per_layer * layers < 0x1p62L,
                "model '{}' with T={} tokens per rank and sequences of {} saves up to {:.3g} bytes of "
                "activations, beyond the 2^62 that the plan counts in: choose fewer tokens or a shorter "
                "--seq-len",
                m.name, in.tokens, in.seq_len, static_cast<double>(per_layer * layers));
  }
  const int64_t n = in.tokens, d = m.d_model, batch = n / chunk;
  // The keys a chunk's attention saves: the positions up to its own; the last CP chunk's reach all S.
  const int64_t keys = in.seq_len;
  // Saved operands whose only reader is a BF16 weight-gradient product (nn/linear_products' saved_operand).
  const int64_t narrow = in.bf16_products ? 2 : kF32;
  // The experts' gate and up pre-activations (ExpertMlpState, rows of padded_stride): BF16 under BF16
  // products, as autocast's products return them (moe/expert_mlp.hpp).
  const int64_t pre = in.bf16_products ? 2 : kF32;
  const int64_t heads = ceil_div(m.heads, in.tp), kv_heads = ceil_div(m.kv_heads, in.tp);

  SavedActivations s;
  int64_t attention = 0;
  if (m.attention == AttentionKind::Mla) {
    // nn/latent_attention's LatentAttentionSaved; its products are f32 only (expar train refuses
    // --precision bf16 with it), so every tensor is f32.
    const int64_t qk = int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim, latent = m.kv_lora_rank;
    attention += kF32 * n * d;  // the input rows (the norm's output, by reference)
    attention += kI32 * n;      // positions
    if (m.q_lora_rank > 0)      // q_a's norm input and 1/rms, and its output q_a
      attention += kF32 * (2 * n * m.q_lora_rank + n);
    attention += kF32 * batch * keys * (latent + m.qk_rope_head_dim);  // the latent rows (c_n, k_rope)
    attention += kF32 * (n * latent + n);                              // the kv norm's input and 1/rms
    attention += kF32 * n * heads * qk;                                // q after RoPE
    attention += kF32 * batch * keys * heads * (qk + m.v_head_dim);    // k and v, expanded per head
    attention += kF32 * batch * heads * chunk * keys;                  // probabilities
    attention += kF32 * n * heads * m.v_head_dim;                      // context
  } else {
    // nn/attention's AttentionSaved.
    const int64_t hd = m.head_dim, qd = heads * hd, kd = kv_heads * hd;
    attention += narrow * n * d;                       // the input rows (BF16 products: their BF16 rounding)
    attention += kI32 * n;                             // positions
    attention += kF32 * n * qd;                        // q after RoPE
    attention += kF32 * 2 * batch * keys * kd;         // k and v, every key position of the chunk's sequences
    attention += kF32 * batch * heads * chunk * keys;  // probabilities
    attention += narrow * n * qd;                      // context, the output projection's input
    if (m.qk_norm != QkNormKind::None) {
      // The q and k norms' inputs, and 1/rms per normalised row (per head or per projection row).
      attention += kF32 * n * (qd + kd);
      attention += kF32 * (m.qk_norm == QkNormKind::PerHead ? n * (heads + kv_heads) : 2 * n);
    }
  }
  s.attention = in.layers * attention;

  // Per layer: the residual stream into the attention norm and into the MLP norm (the norms' saved inputs),
  // each norm's 1/rms, and the MLP norm's output (the router's, shared and dense experts' input).
  s.residuals = in.layers * (3 * kF32 * n * d + 2 * kF32 * n);

  // Per MoE layer: router logits and scores [T, E], top-k experts and weights [T, K], and the route map's
  // destination ranks and rows [T, K].
  const int64_t k = m.top_k;
  s.router = in.moe_layers * (2 * kF32 * n * m.num_experts + kI32 * n * k + kF32 * n * k + 2 * kI32 * n * k);

  // The routed experts, unless recomputed: their pre-activations (gate and up, rows of the padded stride,
  // f32 or BF16) for the rows the rank receives, and the rows the path keeps.
  s.expert_rows = max_capacity_rows(n, m.top_k, placement, in.capacity);
  const int64_t rows = s.expert_rows;
  int64_t experts = 2 * pre * rows * padded_stride(m.expert_hidden);
  const int64_t gathered = kF32 * n * k * d;  // the expert outputs gathered back to their routes [T, K, d]
  if (in.path == "local") {
    experts += 2 * kF32 * rows * d;  // the expert-side input and output buffers, f32
  } else if (in.path == "block") {
    experts += rows * static_cast<int64_t>(payload_row_bytes(in.dispatch_format, d)) + gathered;
  } else if (in.path == "rowwise" || in.path == "aggregated") {
    experts += gathered;  // their expert-side rows are in the symmetric lease pool (plan_buffers.hpp)
  } else {
    // agrs: the expert-side input and output buffers, and the gathered tokens of the group's M sources
    // with their routes' destination ranks, rows and weights.
    const int64_t gathered_tokens = int64_t{placement.ep_size()} * n;
    experts += 2 * kF32 * rows * d + gathered_tokens * (kF32 * d + 2 * kI32 * k + kF32 * k);
  }
  s.experts = int64_t{in.moe_layers - in.recomputed_moe_layers} * experts;

  // Shared experts (every MoE layer, never recomputed) and dense MLP layers: gate and up pre-activations; a
  // gated shared expert also keeps its unscaled output and one f32 gate value per token (the latter in a
  // vector the memory tracker does not see).
  if (m.shared_experts > 0) {
    const int64_t width = ceil_div(int64_t{m.shared_experts} * m.shared_hidden, in.tp);
    int64_t shared = 2 * pre * n * padded_stride(width);
    if (m.shared_expert_gate) shared += kF32 * n * d + kF32 * n;
    s.mlps += in.moe_layers * shared;
  }
  s.mlps += in.dense_mlp_layers * 2 * pre * n * padded_stride(ceil_div(m.dense_hidden, in.tp));

  if (in.has_embedding) s.head += kI32 * n;  // the token ids (the embedding's backward scatters by them)
  if (in.has_lm_head) {
    s.head += kF32 * n * d + kF32 * n;              // the final norm's input and 1/rms
    s.head += narrow * n * d;                       // the LM head's input
    s.head += kF32 * n * ceil_div(m.vocab, in.tp);  // the loss gradient of the logits, held until backward
  }
  return s;
}

SavedActivations model_saved_activations(MoeTransformer& model, int64_t tokens, int64_t seq_len, int cp) {
  const ModelConfig& c = model.config();
  const ModelExecution& e = model.execution();
  ActivationPlanInputs in;
  in.model = model_shape(Architecture{ModelFormat::Expar, c, model.features()}, "the run's model");
  in.tokens = tokens;
  in.seq_len = seq_len;
  in.cp = cp;
  in.layers = c.layers;
  for (int l = 0; l < c.layers; ++l) {
    if (!model.has_moe(l)) continue;
    ++in.moe_layers;
    if (model.recomputes_moe(l)) ++in.recomputed_moe_layers;
  }
  in.dense_mlp_layers = c.layers - in.moe_layers;
  in.capacity = e.moe.capacity;
  in.path = e.moe.path;
  in.dispatch_format = e.moe.precision.dispatch;
  in.bf16_products = e.bf16_products;
  return saved_activations(in, model.first_moe().placement());
}

}  // namespace expar
