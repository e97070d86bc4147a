#include "expar/train/plan_buffers.hpp"

#include <fmt/format.h>

#include "expar/core/error.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/moe/symmetric_budget.hpp"
#include "expar/train/plan_activations.hpp"

namespace expar {

Plan plan_training(const PlanConfig& config, const PlanBufferOptions& buffers) {
  Plan plan = make_plan(config);
  const ModelShape& m = config.model;
  buffers.precision.validate(m.d_model);
  const CapacityPolicy policy =
      config.capacity_factor > 0
          ? CapacityPolicy::with(capacity_rule_from_name(config.capacity_policy), config.capacity_factor)
          : CapacityPolicy::dropless();
  const ExpertPlacement placement = plan.layout.expert_placement(m.num_experts, config.placement);
  const bool aggregated = buffers.path == "aggregated";
  EXPAR_CHECK(
      aggregated || buffers.path == "rowwise",
      "--path {}: the plan sizes the symmetric buffers of rowwise and aggregated (the paths that lease "
      "slots from the model's shared pool); pass --path rowwise or --path aggregated",
      buffers.path);
  PackBudget pack;
  if (aggregated)
    pack = aggregated_pack_budget(config.tokens_per_rank, m.top_k, placement, policy, buffers.ranks_per_node,
                                  m.d_model, buffers.precision);
  ActivationPlanInputs acts;
  acts.model = m;
  acts.tokens = config.tokens_per_rank;
  acts.cp = config.cp;
  acts.seq_len = buffers.seq_len > 0 ? buffers.seq_len : config.tokens_per_rank * config.cp;
  acts.tp = config.tp;
  acts.capacity = policy;
  acts.path = buffers.path;
  acts.dispatch_format = buffers.precision.dispatch;
  acts.bf16_products = buffers.bf16_products;
  int64_t expert_rows = 0;
  for (StagePlan& s : plan.stages) {
    acts.layers = s.end_layer - s.first_layer;
    acts.moe_layers = s.moe_layers;
    acts.dense_mlp_layers = s.dense_mlp_layers;
    acts.has_embedding = s.has_embedding;
    acts.has_lm_head = s.has_lm_head;
    acts.recomputed_moe_layers = buffers.recompute_moe ? s.moe_layers : 0;
    const SavedActivations saved = saved_activations(acts, placement);
    s.activation_bytes = saved.total();
    s.total_bytes += s.activation_bytes;
    expert_rows = saved.expert_rows;
    const RowwiseBudget b =
        rowwise_budget(config.tokens_per_rank, m.top_k, placement, policy, m.d_model, buffers.precision,
                       s.moe_layers, buffers.recompute_moe ? s.moe_layers : 0);
    s.symmetric_leased_slots = b.leased_slots;
    s.symmetric_scratch_slots = b.scratch_slots;
    s.symmetric_pack_bytes = aggregated ? s.moe_layers * pack.block_bytes : 0;
    s.symmetric_bytes = b.resident_bytes() + s.symmetric_pack_bytes;
    s.total_bytes += s.symmetric_bytes;
    s.fits = config.device_memory_bytes == 0 || s.total_bytes <= config.device_memory_bytes;
    plan.capacity_rows = b.capacity_rows;
    plan.slot_bytes = static_cast<int64_t>(b.slot_bytes);
  }
  const int64_t e_local = plan.local_experts, bound_rows = std::min<int64_t>(m.top_k, e_local);
  const std::string rule =
      policy.rule == CapacityRule::Dropless
          ? fmt::format("dropless: the bound M_E*T*min(K, E_L) = {}*{}*{}", plan.layout.ep_mp,
                        config.tokens_per_rank, bound_rows)
          : fmt::format("capacity policy {} cf={}", capacity_rule_name(policy.rule), policy.capacity_factor);
  plan.buffer_sizing = fmt::format(
      "rowwise lease pool, slots of {} rows ({}) x {} bytes ({}); per stage one dispatch lease per MoE layer "
      "{}+ 1 input-gradient lease + {} scratch slot(s), one microbatch in flight",
      plan.capacity_rows, rule, buffers.precision.max_row_bytes(m.d_model), buffers.precision.describe(),
      buffers.recompute_moe ? "(none: recomputed) " : "", buffers.recompute_moe ? 2 : 1);
  plan.symmetric_path = buffers.path;
  plan.activation_sizing = fmt::format(
      "one microbatch in flight, {} saved as expar train --precision {} saves them{}; the routed experts' "
      "rows at the capacity, {} per MoE layer{}",
      config.cp > 1 ? fmt::format("{} chunk(s) of {} tokens per rank, of sequences of {} (the last chunk's "
                                  "attention keeps all {} keys),",
                                  config.tokens_per_rank * config.cp / acts.seq_len, acts.seq_len / config.cp,
                                  acts.seq_len, acts.seq_len)
                    : fmt::format("{} sequence(s) of {} tokens per rank,",
                                  config.tokens_per_rank / acts.seq_len, acts.seq_len),
      buffers.bf16_products ? "bf16" : "f32",
      buffers.bf16_products && m.attention == AttentionKind::Mla
          ? " (latent attention's as f32: its products are f32 only)"
          : "",
      expert_rows, buffers.recompute_moe ? " (recomputed: not saved)" : "");
  if (aggregated) {
    plan.pack_bound_rows = pack.bound_rows;
    plan.pack_exact = pack.exact();
    plan.buffer_sizing +=
        pack.exact()
            ? fmt::format(
                  "; aggregated: + 1 pack buffer per MoE layer of one row ({} bytes: the EP group of {} "
                  "fits in a node of {} ranks, nothing is packed)",
                  pack.block_bytes, plan.layout.ep_mp, buffers.ranks_per_node)
            : fmt::format(
                  "; aggregated: + 1 pack buffer per MoE layer, at most {} bytes each (the routes size "
                  "it: a proxy holds at most {} rows, {} nodes of {} ranks; grown by powers of two, every "
                  "generation kept)",
                  pack.block_bytes, pack.bound_rows, pack.nodes, buffers.ranks_per_node);
  }
  return plan;
}

}  // namespace expar
