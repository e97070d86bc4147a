#include "expar/topo/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "expar/core/error.hpp"

namespace expar {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_config(const PlanConfig& c) {
  validate(c.model);
  const ModelShape& m = c.model;
  EXPAR_CHECK(c.tokens_per_rank >= 1, "tokens per rank T={} must be at least 1", c.tokens_per_rank);
  EXPAR_CHECK(c.microbatches >= 1, "microbatches={} must be at least 1", c.microbatches);
  EXPAR_CHECK(
      std::isfinite(c.capacity_factor) && c.capacity_factor >= 0,
      "capacity factor {} must be a positive number (1.0 = exactly the balanced load; 1.25 is common) "
      "or 0 for dropless",
      c.capacity_factor);
  EXPAR_CHECK(c.optimizer_states >= 0, "optimizer_states={} must not be negative (Adam keeps 2)",
              c.optimizer_states);
  EXPAR_CHECK(c.device_memory_bytes >= 0, "device memory {} bytes must not be negative",
              c.device_memory_bytes);
  // Every figure is an int64 count: bound the largest ones in long double first, so that a huge input is an
  // error instead of wrapped (negative) byte counts. An upper bound of the parameters per layer:
  using ld = long double;
  const ld d = m.d_model,
           attention = d * ld(m.heads + 2 * m.kv_heads) * m.head_dim + ld(m.heads) * m.head_dim * d;
  const ld mlp = 3 * d * std::max<ld>(m.dense_hidden, ld(m.shared_experts) * m.shared_hidden);
  const ld experts = ld(m.num_experts) * (3 * d * m.expert_hidden + d);
  const ld params = ld(m.layers) * (attention + mlp + experts + 2 * d) + 2 * ld(m.vocab) * d;
  const ld bytes_per_param = 4 + 4 + ld(c.optimizer_states) * 8 + 4;
  const ld rows =
      std::max<ld>(1, c.capacity_factor) * c.world * ld(c.tokens_per_rank) * m.top_k + m.num_experts;
  const ld traffic = ld(c.tokens_per_rank) * m.top_k * d * 4 * 4 * m.layers * c.microbatches;
  const ld largest = std::max({params * bytes_per_param, rows * d * 8, traffic});
  EXPAR_CHECK(largest < 0x1p62L,
              "model '{}' with {:.3g} parameters on this layout needs figures up to {:.3g} bytes, beyond the "
              "2^62 that expar plan counts in: choose smaller dimensions, tokens or microbatches",
              m.name, static_cast<double>(params), static_cast<double>(largest));
}

StagePlan plan_stage(const PlanConfig& c, const TrainingLayout& layout, int stage, int local_experts) {
  const ModelShape& m = c.model;
  StagePlan s;
  s.stage = stage;
  const int per_stage = m.layers / c.pp;
  s.first_layer = stage * per_stage;
  s.end_layer = s.first_layer + per_stage;
  // Dense layers are the first dense_layers blocks: count how many fall inside this stage.
  s.dense_mlp_layers = std::clamp(m.dense_layers - s.first_layer, 0, per_stage);
  s.moe_layers = per_stage - s.dense_mlp_layers;
  s.has_embedding = stage == 0;
  s.has_lm_head = stage == c.pp - 1;

  int64_t tp_sharded = per_stage * attention_params_per_layer(m) +
                       s.dense_mlp_layers * dense_mlp_params_per_layer(m) +
                       s.moe_layers * shared_expert_params_per_layer(m);
  int64_t replicated = per_stage * norm_params_per_layer(m) + s.moe_layers * router_params_per_layer(m);
  if (s.has_embedding) tp_sharded += embedding_params(m);
  if (s.has_lm_head) {
    tp_sharded += lm_head_params(m);
    replicated += m.d_model;  // final norm
  }
  s.dense_params = ceil_div(tp_sharded, c.tp) + replicated;
  s.expert_params = int64_t{s.moe_layers} * local_experts * one_expert_params(m);

  const int64_t pbytes = static_cast<int64_t>(dtype_size(c.param_dtype));
  const int64_t gbytes = static_cast<int64_t>(dtype_size(c.grad_dtype));
  const int64_t obytes = c.optimizer_states * static_cast<int64_t>(dtype_size(c.optimizer_dtype)) +
                         (c.master_weights ? int64_t{4} : int64_t{0});
  const int64_t abytes = static_cast<int64_t>(dtype_size(c.activation_dtype));
  s.dense_weight_bytes = s.dense_params * pbytes;
  s.expert_weight_bytes = s.expert_params * pbytes;
  s.dense_grad_bytes = s.dense_params * gbytes;
  s.expert_grad_bytes = s.expert_params * gbytes;
  const int dense_replicas = layout.dp * layout.cp;
  const int64_t dense_opt_params =
      c.shard_optimizer ? ceil_div(s.dense_params, dense_replicas) : s.dense_params;
  const int64_t expert_opt_params =
      c.shard_optimizer ? ceil_div(s.expert_params, layout.ep_dp) : s.expert_params;
  s.dense_optimizer_bytes = dense_opt_params * obytes;
  s.expert_optimizer_bytes = expert_opt_params * obytes;

  const int64_t row_bytes = int64_t{m.d_model} * abytes;
  s.total_bytes = s.dense_weight_bytes + s.expert_weight_bytes + s.dense_grad_bytes + s.expert_grad_bytes +
                  s.dense_optimizer_bytes + s.expert_optimizer_bytes;
  s.fits = c.device_memory_bytes == 0 || s.total_bytes <= c.device_memory_bytes;

  // Balanced routing: (M_E-1)/M_E of a rank's T*K routes leave the rank.
  const int64_t routes = c.tokens_per_rank * m.top_k;
  s.dispatch_bytes_per_layer = routes * (layout.ep_mp - 1) * row_bytes / layout.ep_mp;
  s.combine_bytes_per_layer = s.dispatch_bytes_per_layer;
  s.ep_bytes_per_step =
      2 * (s.dispatch_bytes_per_layer + s.combine_bytes_per_layer) * s.moe_layers * int64_t{c.microbatches};
  s.expert_grad_reduce_bytes = ring_allreduce_bytes(s.expert_grad_bytes, layout.ep_dp);
  s.dense_grad_reduce_bytes = ring_allreduce_bytes(s.dense_grad_bytes, dense_replicas);
  return s;
}

}  // namespace

int64_t ring_allreduce_bytes(int64_t bytes, int n) {
  EXPAR_CHECK(n >= 1 && bytes >= 0, "ring all-reduce over n={} ranks of {} bytes: n must be >= 1, bytes >= 0",
              n, bytes);
  // 2(n-1)/n * bytes, split as q*n + r so that multi-terabyte gradients over large groups cannot overflow.
  const int64_t q = bytes / n, r = bytes % n;
  return q * 2 * (n - 1) + r * 2 * (n - 1) / n;
}

DType plan_dtype_from_name(const std::string& name) {
  std::string lower;
  for (char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "bf16" || lower == "bfloat16") return DType::BF16;
  if (lower == "f16" || lower == "fp16" || lower == "float16") return DType::F16;
  if (lower == "f32" || lower == "fp32" || lower == "float32") return DType::F32;
  if (lower == "fp8" || lower == "f8" || lower == "f8_e4m3" || lower == "e4m3") return DType::F8E4M3;
  fail("precision '{}' is unknown: use one of {}", name, fmt::join(plan_dtype_names(), ", "));
}

std::vector<std::string> plan_dtype_names() {
  return {"bf16", "f16", "f32", "fp8"};
}

Plan make_plan(const PlanConfig& config) {
  check_config(config);
  const ModelShape& m = config.model;
  // The layout's rules and the model counts it must divide, in one validation, so that a suggested PP, TP, C
  // or M_E is accepted by all of them.
  const TrainingLayout layout(TrainingLayoutConfig{config.world, config.ep_mp, config.cp, config.tp,
                                                   config.pp, m.num_experts, m.layers, m.heads, m.name});
  const ExpertPlacement placement = layout.expert_placement(m.num_experts, config.placement);
  const int local_experts = placement.local_count();

  Plan plan(config, layout);
  plan.local_experts = local_experts;
  plan.total_params = total_params(m);
  plan.active_params = active_params(m);
  plan.routed_expert_params = routed_expert_params(m);
  plan.reduction_algorithm = "ring all-reduce: each rank sends 2(n-1)/n x its gradient bytes";
  for (int p = 0; p < config.pp; ++p) plan.stages.push_back(plan_stage(config, layout, p, local_experts));
  return plan;
}

}  // namespace expar
