#pragma once
// The router (replicated on every rank): logits = x·W_rᵀ in f32, a score function, top-K selection with
// optional group limits and a selection-only score bias, the K weights (optionally renormalised), and the two
// auxiliary losses with their gradients. Explicit forward/backward with a saved-state struct.
//
// Conventions:
//  - Ties in top-K (and in group selection) go to the lower index, always.
//  - softmax_over_topk (gpt-oss): the K largest LOGITS are selected and the weights are the softmax over
//    those K logits (the same weights as softmax-then-renormalise in exact arithmetic, and the selection
//    the reference makes: on the logits, not on rounded probabilities).
//  - A logit bias (gpt-oss's router bias, a parameter) is added to the logits before anything else; the
//    score bias is not a parameter and changes selection only.
//  - routed_scale multiplies the K weights last (DeepSeek-V2/V3's routed_scaling_factor: sigmoid scores
//    renormalised to sum 1 are scaled back up so the routed experts' output keeps its magnitude).
//  - The score bias (auxiliary-loss-free balancing) changes SELECTION only (top-K and group scores); the
//    weights always come from the unbiased scores.
//  - Group-limited routing (DeepSeek-V3): the E experts form n_group consecutive groups; a group's score is
//    the sum of its top-min(2, group size) selection scores for sigmoid and its max selection score for
//    softmax; only experts of the topk_group best groups are eligible.
//  - Load-balancing loss: L_aux = E/K · Σ_e f_e·P_e over this rank's tokens, f_e = (routes choosing e)/(T·K)
//    (a count: no gradient), P_e = mean over tokens of the (unbiased, unrenormalised) score of e.
//  - Sequence-wise load-balancing loss (aux_loss_kind Sequence; DeepSeek-V2/V3's seq_aux, the V3 paper's
//    complementary sequence-wise balance loss), in place of L_aux: each loss-scope batch is one sequence of
//    T tokens, and
//    L_aux = Σ_e f_e·P_e with f_e = E/(K·T) · (routes choosing e), P_e = mean over its tokens of
//    s'_{t,e} = s_{t,e} / Σ_j s_{t,j} (every expert's unbiased score normalised over all experts: for sigmoid
//    scores this matters; for softmax s' = s); the mean over the batches, as ever. The caller makes the
//    batches the sequences (model/moe_transformer.cpp: one batch per sequence, summed over the CP group).
//    Note the scale: at uniform routing it is 1 where the batch form's is 1/K.
//  - Router z-loss: L_z = mean over tokens of logsumexp(logits_t)², whatever the score function.
//  - The layer's loss gains aux_loss_coef·L_aux + z_loss_coef·L_z; the outputs report L_aux and L_z
//    unscaled and router_backward adds the scaled gradients. With T = 0 both losses are 0.
//  - A loss scope (RouterLossScope) says which tokens "this rank's tokens" are: the T rows form `batches`
//    equal consecutive row ranges, each a batch of its own whose statistics (tokens, routes per expert,
//    score sums, Σ logsumexp²) are summed over the scope's group (one all-reduce of batches·(2E + 2)
//    doubles); L_aux and L_z are the means over the batches of each batch's loss, every rank of the group
//    reports them, and each rank's backward adds their gradient w.r.t. its own tokens, so the group's
//    gradient sum is that of the losses of the whole batches. Context parallelism uses it (the CP group's
//    ranks hold chunks of the same sequences; model/moe_transformer.hpp). The default scope (no group, one
//    batch) is the definition above, bit for bit.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"

namespace expar {

class Comm;

// Which tokens the two losses are over (see above). Default: this rank's T tokens, one batch.
struct RouterLossScope {
  Comm* group = nullptr;  // ranks whose rows together form each batch; null: this rank alone
  int batches = 1;        // equal consecutive row ranges of the T rows (must divide T), the losses' mean
};

enum class ScoreFunction : uint8_t { Softmax, Sigmoid };
// The load-balancing loss's form (above): over each batch (E/K · Σ f·P, unnormalised scores), or per
// sequence (DeepSeek's seq_aux: Σ f·P with f = E/(K·T)·count and scores normalised over the experts).
enum class AuxLossKind : uint8_t { Batch, Sequence };
ScoreFunction score_function_from_name(const std::string& name);  // "softmax" | "sigmoid"
std::string score_function_name(ScoreFunction fn);
// Every score function's name (the choices the command line lists).
std::vector<std::string> score_function_names();

struct RouterConfig {
  int num_experts = 0;
  int top_k = 0;
  ScoreFunction score = ScoreFunction::Softmax;
  bool renormalize = false;        // weights = scores of the K / their sum
  bool softmax_over_topk = false;  // top-K of the logits, weights = softmax over them (Softmax, no groups)
  int n_group = 1;                 // > 1: group-limited routing
  int topk_group = 1;              // groups eligible per token (with n_group > 1)
  // Every weight is multiplied by it after the renormalisation (DeepSeek's routed_scaling_factor); finite,
  // positive; 1 with softmax_over_topk.
  double routed_scale = 1.0;
  double aux_loss_coef = 0.0;
  AuxLossKind aux_loss_kind = AuxLossKind::Batch;  // Sequence: each loss-scope batch is one sequence
  double z_loss_coef = 0.0;
  // Throws expar::Error naming the value and the fix (K > E, E not divisible by n_group, ...).
  void validate() const;
};

struct RouterState {
  Tensor x;                            // [T, d], saved by reference
  Tensor logits;                       // [T, E] f32
  Tensor scores;                       // [T, E] f32, score function of the logits (no bias)
  Tensor topk_idx;                     // [T, K] int32
  Tensor topk_weight;                  // [T, K] f32
  std::vector<int64_t> expert_counts;  // [E] routes choosing each expert
  // What the losses were computed over (RouterLossScope): per batch, its routes per expert (over the group)
  // and its tokens.
  std::vector<int64_t> loss_counts;  // [batches * E]
  std::vector<int64_t> loss_tokens;  // [batches]
};

struct RouterOutput {
  Tensor topk_idx;                     // [T, K] int32, experts of a token in descending selection score
  Tensor topk_weight;                  // [T, K] f32
  double aux_loss = 0.0;               // L_aux, unscaled
  double z_loss = 0.0;                 // L_z, unscaled
  std::vector<int64_t> expert_counts;  // [E] this rank's routes per expert
};

// x [T, d] f32, w_router [E, d] f32, score_bias [E] f32 or null, logit_bias [E] f32 or null. Collective
// over scope.group when it has more than one rank.
RouterOutput router_forward(const RouterConfig& config, const Tensor& x, const Tensor& w_router,
                            const Tensor* score_bias, RouterState& state, const Tensor* logit_bias = nullptr,
                            const RouterLossScope& scope = {});

// grad_topk_weight [T, K]: the gradient of the loss w.r.t. the K weights (from combine). ADDS the router's
// contribution to grad_x [T, d] and to grad_w_router [E, d] (both must be initialised by the caller), and to
// grad_logit_bias [E] when the forward had a logit bias.
void router_backward(const RouterConfig& config, const RouterState& state, const Tensor& w_router,
                     const Tensor& grad_topk_weight, Tensor& grad_x, Tensor& grad_w_router,
                     Tensor* grad_logit_bias = nullptr);

}  // namespace expar
