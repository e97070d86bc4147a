#pragma once
// The activations a training forward saves for its backward, per rank and microbatch: the one formula that
// `expar plan` (its "activations saved" row, in the total and the fit) and the trainer's start-up memory
// table state. It counts the tensors MoeTransformer's forward_train leaves held until backward (core/
// memory's MemCategory::Activations, what tests/train/plan_activations_test.cpp compares it with, exactly),
// term by term in plan_activations.cpp, as `expar train --precision f32|bf16` saves them: under BF16
// products attention's input rows and context and the LM head's input are saved as BF16 (the only readers
// are BF16 weight-gradient products), and so are the experts' (routed, shared, dense MLP) gate and up
// pre-activations (BF16 as the products return them); everything else stays f32.
//
// What depends on the routing, the rows a rank's experts receive, is counted at the most the capacity policy
// lets a rank receive (moe/capacity's max_capacity_rows: with a capacity factor the rule's capacity, dropless
// the bound M_E*T*min(K, E_L)), so a forward holds at most this figure, and exactly this figure when the
// routing fills a rank to its capacity. Not counted: transients inside a forward (the logits next to their
// gradient at the loss, the experts' scratch), and the expert rows a path keeps in symmetric buffers
// (rowwise and aggregated: plan_buffers.hpp counts those).
#include <cstdint>
#include <string>

#include "expar/moe/capacity.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/topo/model_shapes.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class MoeTransformer;

struct ActivationPlanInputs {
  ModelShape model;
  int64_t tokens = 0;   // T: this rank's tokens per microbatch (a CP chunk's rows)
  int64_t seq_len = 0;  // S: tokens of one whole sequence; each rank holds T / (S / cp) chunks of S / cp
  int cp = 1;           // context parallelism: the last chunk's attention saves the keys of all S positions
  int tp = 1;           // tensor parallelism: attention's heads and the MLPs' widths split over tp (ceil)
  int layers = 0, moe_layers = 0, dense_mlp_layers = 0;  // of this pipeline stage
  bool has_embedding = true, has_lm_head = true;         // the first / last stage
  CapacityPolicy capacity;
  std::string path = "rowwise";                        // local | block | rowwise | aggregated | agrs
  PayloadFormat dispatch_format = PayloadFormat::F32;  // block: the expert-side rows are saved as they arrive
  bool bf16_products = false;                          // expar train --precision bf16
  int recomputed_moe_layers = 0;  // MoE layers of the stage recomputed in backward (--recompute-moe)
};

struct SavedActivations {
  int64_t attention = 0;    // attention's input rows, positions, q/k/v (and q/k norm inputs), probabilities,
                            // context; every layer
  int64_t residuals = 0;    // the residual stream into each norm, 1/rms, the MLP input; every layer
  int64_t router = 0;       // logits, scores, top-k and the route map; every MoE layer
  int64_t experts = 0;      // the path's saved rows and the routed experts' pre-activations; MoE layers
  int64_t mlps = 0;         // shared experts' and dense MLPs' pre-activations (and a gated shared output)
  int64_t head = 0;         // the tokens, the final norm, the LM head's input, the loss gradient
  int64_t expert_rows = 0;  // rows a rank's experts are counted for per MoE layer (the capacity)
  int64_t total() const { return attention + residuals + router + experts + mlps + head; }
};

// `placement`: the routed experts' slots over the EP group. Throws expar::Error naming the value and the fix
// for an unknown path, S not a multiple of cp or T not a whole number of chunks.
SavedActivations saved_activations(const ActivationPlanInputs& in, const ExpertPlacement& placement);

// The same for `model`'s training forward of `tokens` rows on this rank (sequences of seq_len tokens, in
// chunks of seq_len / cp): its shape (model/model_shape), path, dispatch payload, products, recomputed
// blocks and the experts' placement. What the trainer's start-up table states.
SavedActivations model_saved_activations(MoeTransformer& model, int64_t tokens, int64_t seq_len, int cp);

}  // namespace expar
