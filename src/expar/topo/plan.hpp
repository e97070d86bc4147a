#pragma once
// The training plan behind `expar plan`: per-rank memory and per-step communication for a model and a
// layout, for model sizes far beyond the machine that computes it (seed 000 §5.1, equations 8 and 9).
//
// What each figure assumes (also in docs/plan.md):
//  - Layout: TrainingLayout (W, C, TP, PP, M_E). Dense weights are split evenly over TP (attention, dense
//    MLPs, shared experts, embedding, LM head; ceil); norms and the router are replicated. Routed experts are
//    sharded over EP_MP and replicated over EP_DP: a rank holds E_L = N / M_E experts of every MoE layer of
//    its pipeline stage, so with PP = 1 its expert weights are exactly P_E / M_E (eq. 9).
//  - Pipeline stage p holds layers [p*L/PP, (p+1)*L/PP); the embedding is on stage 0, the LM head and the
//    final norm on the last stage. Ranks of one stage are identical; each stage is reported.
//  - Gradients: one element per parameter in grad_dtype. Optimizer state: optimizer_states elements (2 for
//    Adam) per parameter in optimizer_dtype, plus an f32 master copy when master_weights; with
//    shard_optimizer the expert state is sharded over EP_DP and the dense state over the D*C dense replicas.
//  - Tokens: tokens_per_rank is T, the tokens a rank feeds into each MoE layer per microbatch (after any CP
//    or sequence-parallel split).
//  - Activations saved for backward (one microbatch in flight, as the trainer runs): NOT computed here
//    either (they depend on moe/'s capacity and the model's saved tensors): train/plan_buffers.hpp fills
//    each stage's activation_bytes with train/plan_activations.hpp and adds them to total_bytes.
//  - Symmetric buffers (the rowwise path's lease pool): NOT computed here (topo/ sits above moe/, whose
//    capacity policy and lease rules size them): train/plan_buffers.hpp fills Plan::capacity_rows,
//    slot_bytes and each stage's symmetric_* figures with the functions the trainer allocates with
//    (moe/symmetric_budget.hpp) and adds them to total_bytes. make_plan alone leaves them 0.
//  - Dispatch/combine traffic, balanced routing: of the T*K routes of a rank, (M_E-1)/M_E go to another
//    rank; dispatch sends that many rows of d_model activations and combine returns as many. Backward moves
//    the same volumes again (gradients, the adjoint movements of Table 8). Per step: x 2 (forward and
//    backward) x MoE layers of the stage x microbatches.
//  - Gradient reduction: ring all-reduce, each rank sends 2(n-1)/n of its gradient bytes to its neighbour;
//    expert gradients over EP_DP (n = D_E), dense gradients over the D*C dense replicas (n = D*C). A
//    reduce-scatter + all-gather pair for a sharded optimizer moves the same bytes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "expar/core/dtype.hpp"
#include "expar/topo/model_shapes.hpp"
#include "expar/topo/placement.hpp"
#include "expar/topo/training_layout.hpp"

namespace expar {

struct PlanConfig {
  ModelShape model;
  int world = 1, ep_mp = 1, cp = 1, tp = 1, pp = 1;
  PlacementKind placement = PlacementKind::Contiguous;
  DType param_dtype = DType::BF16;
  DType grad_dtype = DType::F32;
  DType optimizer_dtype = DType::F32;
  DType activation_dtype = DType::BF16;
  int optimizer_states = 2;  // Adam: first and second moment
  bool master_weights = true;
  bool shard_optimizer = false;
  int64_t tokens_per_rank = 4096;  // T per microbatch
  int microbatches = 1;
  double capacity_factor = 1.25;           // 0: dropless
  std::string capacity_policy = "source";  // the rule with a capacity factor: source | rank | expert
  int64_t device_memory_bytes = 0;         // 0: no fit check
};

struct StagePlan {
  int stage = 0;
  int first_layer = 0, end_layer = 0;  // [first, end)
  int moe_layers = 0, dense_mlp_layers = 0;
  bool has_embedding = false, has_lm_head = false;

  // Per-rank parameter elements.
  int64_t dense_params = 0;
  int64_t expert_params = 0;

  // Per-rank bytes.
  int64_t dense_weight_bytes = 0, expert_weight_bytes = 0;
  int64_t dense_grad_bytes = 0, expert_grad_bytes = 0;
  int64_t dense_optimizer_bytes = 0, expert_optimizer_bytes = 0;
  // Symmetric buffers (train/plan_buffers.hpp): leased slots (a dispatch lease per MoE layer + the
  // input-gradient lease) and scratch slots of the rowwise lease pool, and their bytes.
  int symmetric_leased_slots = 0, symmetric_scratch_slots = 0;
  int64_t symmetric_pack_bytes = 0;  // the aggregated path's pack buffers (part of symmetric_bytes)
  int64_t symmetric_bytes = 0;
  // The activations one microbatch's forward saves for its backward (train/plan_activations.hpp).
  int64_t activation_bytes = 0;
  int64_t total_bytes = 0;
  bool fits = true;  // total_bytes <= device_memory_bytes (true when no device memory was given)

  // Communication, bytes sent by one rank.
  int64_t dispatch_bytes_per_layer = 0;  // per MoE layer and microbatch, forward
  int64_t combine_bytes_per_layer = 0;
  int64_t ep_bytes_per_step = 0;  // dispatch + combine, forward + backward, all MoE layers and microbatches
  int64_t expert_grad_reduce_bytes = 0;  // per step, over EP_DP
  int64_t dense_grad_reduce_bytes = 0;   // per step, over D*C
};

struct Plan {
  Plan(PlanConfig config_, TrainingLayout layout_) : config(std::move(config_)), layout(layout_) {}
  PlanConfig config;
  TrainingLayout layout;
  int local_experts = 0;  // E_L = N / M_E
  // The rowwise lease pool's slots (train/plan_buffers.hpp): rows the capacity policy lets any rank receive
  // (dropless: the bound M_E*T*min(K, E_L)), bytes of one slot, and how that was decided.
  int64_t capacity_rows = 0;
  int64_t slot_bytes = 0;
  std::string buffer_sizing;
  std::string activation_sizing;  // what the saved activations assume (sequence, precision, expert rows)
  std::string symmetric_path;     // the path the symmetric buffers are sized for ("" from make_plan alone)
  int64_t pack_bound_rows = 0;    // aggregated: the most rows a proxy's pack buffer holds (0: one node)
  bool pack_exact = true;         // aggregated: the pack bytes are exact (one node), not a bound
  int64_t total_params = 0, active_params = 0;
  int64_t routed_expert_params = 0;  // P_E
  std::vector<StagePlan> stages;
  std::string reduction_algorithm;  // the collective the reduction byte formulas assume
};

// Throws expar::Error for an impossible layout or configuration (each message names values and a fix).
Plan make_plan(const PlanConfig& config);

// Ring all-reduce: bytes one rank sends for a buffer of `bytes` over n ranks, 2(n-1)/n * bytes.
int64_t ring_allreduce_bytes(int64_t bytes, int n);

// Accepts bf16, f16, f32, fp8 (e4m3) and the safetensors spellings (any case).
DType plan_dtype_from_name(const std::string& name);
// The canonical names above (the choices the command line lists).
std::vector<std::string> plan_dtype_names();

}  // namespace expar
