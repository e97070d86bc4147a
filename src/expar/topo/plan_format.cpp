#include "expar/topo/plan_format.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "expar/core/memory.hpp"

namespace expar {

namespace {

nlohmann::json model_json(const ModelShape& m) {
  nlohmann::json j = {
      {"name", m.name},
      {"layers", m.layers},
      {"d_model", m.d_model},
      {"vocab", m.vocab},
      {"tied_embeddings", m.tied_embeddings},
      {"attention", m.attention == AttentionKind::Mla ? "mla" : "gqa"},
      {"heads", m.heads},
      {"kv_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"num_experts", m.num_experts},
      {"top_k", m.top_k},
      {"expert_hidden", m.expert_hidden},
      {"shared_experts", m.shared_experts},
      {"shared_hidden", m.shared_hidden},
      {"dense_layers", m.dense_layers},
      {"dense_hidden", m.dense_hidden},
  };
  return j;
}

nlohmann::json stage_json(const StagePlan& s) {
  return {
      {"stage", s.stage},
      {"layers", {s.first_layer, s.end_layer}},
      {"moe_layers", s.moe_layers},
      {"dense_mlp_layers", s.dense_mlp_layers},
      {"has_embedding", s.has_embedding},
      {"has_lm_head", s.has_lm_head},
      {"params_per_rank", {{"dense", s.dense_params}, {"expert", s.expert_params}}},
      {"bytes_per_rank",
       {{"dense_weights", s.dense_weight_bytes},
        {"expert_weights", s.expert_weight_bytes},
        {"dense_gradients", s.dense_grad_bytes},
        {"expert_gradients", s.expert_grad_bytes},
        {"dense_optimizer_state", s.dense_optimizer_bytes},
        {"expert_optimizer_state", s.expert_optimizer_bytes},
        {"symmetric_buffers", s.symmetric_bytes},
        {"symmetric_pack_buffers", s.symmetric_pack_bytes},
        {"activations_saved", s.activation_bytes},
        {"total", s.total_bytes}}},
      {"symmetric_slots", {{"leased", s.symmetric_leased_slots}, {"scratch", s.symmetric_scratch_slots}}},
      {"fits", s.fits},
      {"comm_bytes_per_rank",
       {{"dispatch_per_layer_microbatch", s.dispatch_bytes_per_layer},
        {"combine_per_layer_microbatch", s.combine_bytes_per_layer},
        {"ep_per_step", s.ep_bytes_per_step},
        {"expert_grad_reduce_per_step", s.expert_grad_reduce_bytes},
        {"dense_grad_reduce_per_step", s.dense_grad_reduce_bytes}}},
  };
}

std::string groups_text(const std::vector<std::vector<int>>& groups) {
  std::string out;
  for (const auto& g : groups) out += fmt::format("{{{}}} ", fmt::join(g, ","));
  if (!out.empty()) out.pop_back();
  return out;
}

std::string count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  return fmt::format("{}", n);
}

}  // namespace

nlohmann::json plan_to_json(const Plan& plan, int max_group_world) {
  const PlanConfig& c = plan.config;
  const TrainingLayout& l = plan.layout;
  nlohmann::json j;
  j["model"] = model_json(c.model);
  j["params"] = {{"total", plan.total_params},
                 {"active", plan.active_params},
                 {"routed_experts", plan.routed_expert_params},
                 {"routed_experts_per_rank_eq9", plan.routed_expert_params / l.ep_mp}};
  j["layout"] = {{"world", l.world},
                 {"dp", l.dp},
                 {"cp", l.cp},
                 {"tp", l.tp},
                 {"pp", l.pp},
                 {"ep_mp", l.ep_mp},
                 {"ep_dp", l.ep_dp},
                 {"stage_size", l.stage_size},
                 {"placement", placement_name(c.placement)},
                 {"local_experts", plan.local_experts}};
  if (l.world <= max_group_world) {
    j["layout"]["groups"] = {{"ep_mp", l.groups(TrainingGroup::EpMp)},
                             {"ep_dp", l.groups(TrainingGroup::EpDp)},
                             {"dense_grad", l.groups(TrainingGroup::DenseGrad)}};
  }
  j["precision"] = {{"params", std::string(dtype_name(c.param_dtype))},
                    {"gradients", std::string(dtype_name(c.grad_dtype))},
                    {"optimizer", std::string(dtype_name(c.optimizer_dtype))},
                    {"activations", std::string(dtype_name(c.activation_dtype))},
                    {"optimizer_states", c.optimizer_states},
                    {"master_weights", c.master_weights},
                    {"shard_optimizer", c.shard_optimizer}};
  j["tokens"] = {{"tokens_per_rank", c.tokens_per_rank},
                 {"microbatches", c.microbatches},
                 {"capacity_factor", c.capacity_factor},
                 {"capacity_policy", c.capacity_factor > 0 ? c.capacity_policy : "dropless"},
                 {"capacity_rows", plan.capacity_rows},
                 {"slot_bytes", plan.slot_bytes},
                 {"buffer_sizing", plan.buffer_sizing},
                 {"symmetric_path", plan.symmetric_path},
                 {"pack_bound_rows", plan.pack_bound_rows},
                 {"pack_bytes_exact", plan.pack_exact},
                 {"activation_sizing", plan.activation_sizing}};
  j["device_memory_bytes"] = c.device_memory_bytes;
  j["reduction_algorithm"] = plan.reduction_algorithm;
  j["stages"] = nlohmann::json::array();
  for (const auto& s : plan.stages) j["stages"].push_back(stage_json(s));
  return j;
}

std::string format_plan_table(const Plan& plan, int max_group_world) {
  const PlanConfig& c = plan.config;
  const TrainingLayout& l = plan.layout;
  const ModelShape& m = c.model;
  std::string out;
  out += fmt::format(
      "model {}: {} params ({} active), routed experts P_E = {}; {} layers ({} MoE), N={} top-{}\n", m.name,
      count(plan.total_params), count(plan.active_params), count(plan.routed_expert_params), m.layers,
      m.moe_layers(), m.num_experts, m.top_k);
  out += fmt::format(
      "layout: W={} = PP {} x D {} x C {} x TP {}; experts: M_E={} (EP_MP) x D_E={} (EP_DP) per stage; "
      "{} experts per rank ({})\n",
      l.world, l.pp, l.dp, l.cp, l.tp, l.ep_mp, l.ep_dp, plan.local_experts, placement_name(c.placement));
  if (l.world <= max_group_world) {
    out += fmt::format("  EP_MP groups (dispatch/combine): {}\n", groups_text(l.groups(TrainingGroup::EpMp)));
    out += fmt::format("  EP_DP groups (expert gradients): {}\n", groups_text(l.groups(TrainingGroup::EpDp)));
    out += fmt::format("  dense-gradient groups:           {}\n",
                       groups_text(l.groups(TrainingGroup::DenseGrad)));
  }
  out += fmt::format(
      "precision: params {}, grads {}, optimizer {} x{}{}{}, activations {}; T={} tokens/rank/microbatch, "
      "{} microbatch(es)\n",
      dtype_name(c.param_dtype), dtype_name(c.grad_dtype), dtype_name(c.optimizer_dtype), c.optimizer_states,
      c.master_weights ? " + f32 master" : "", c.shard_optimizer ? " (sharded)" : "",
      dtype_name(c.activation_dtype), c.tokens_per_rank, c.microbatches);
  if (!plan.buffer_sizing.empty()) out += fmt::format("symmetric buffers: {}\n", plan.buffer_sizing);
  if (!plan.activation_sizing.empty())
    out += fmt::format("activations saved for backward: {}\n", plan.activation_sizing);

  out += "\nmemory per rank";
  if (c.pp > 1) out += " (per pipeline stage)";
  out += ":\n";
  out += fmt::format("{:<28}", "");
  for (const auto& s : plan.stages) out += fmt::format("{:>14}", fmt::format("stage {}", s.stage));
  out += "\n";
  auto row = [&](const char* label, auto field) {
    out += fmt::format("{:<28}", label);
    for (const auto& s : plan.stages) out += fmt::format("{:>14}", format_bytes(s.*field));
    out += "\n";
  };
  row("dense weights", &StagePlan::dense_weight_bytes);
  row("expert weights (eq. 9)", &StagePlan::expert_weight_bytes);
  row("dense gradients", &StagePlan::dense_grad_bytes);
  row("expert gradients", &StagePlan::expert_grad_bytes);
  row("dense optimizer state", &StagePlan::dense_optimizer_bytes);
  row("expert optimizer state", &StagePlan::expert_optimizer_bytes);
  row("symmetric buffers", &StagePlan::symmetric_bytes);
  if (plan.symmetric_path == "aggregated")
    row(plan.pack_exact ? "  of which pack buffers" : "  of which pack (at most)",
        &StagePlan::symmetric_pack_bytes);
  if (!plan.activation_sizing.empty()) row("activations saved", &StagePlan::activation_bytes);
  row("total", &StagePlan::total_bytes);
  if (c.device_memory_bytes > 0) {
    out += fmt::format("{:<28}", fmt::format("fits in {}", format_bytes(c.device_memory_bytes)));
    for (const auto& s : plan.stages) out += fmt::format("{:>14}", s.fits ? "yes" : "NO");
    out += "\n";
  }

  out += "\ncommunication per rank (bytes sent, balanced routing):\n";
  row("dispatch / MoE layer / mb", &StagePlan::dispatch_bytes_per_layer);
  row("combine / MoE layer / mb", &StagePlan::combine_bytes_per_layer);
  row("EP total / step (fwd+bwd)", &StagePlan::ep_bytes_per_step);
  row("expert grads over EP_DP", &StagePlan::expert_grad_reduce_bytes);
  row("dense grads over D*C", &StagePlan::dense_grad_reduce_bytes);
  out += fmt::format("gradient reductions assume {}\n", plan.reduction_algorithm);
  return out;
}

}  // namespace expar
