#pragma once
// The inference engine (seed 002): one object per rank of a TP x DP world; attention uses TP heads inside a
// DP replica, MoE layers use expert parallelism over the layout's ep_degree partitions.
//
// Collective patterns per MoE layer (T = this replica's new tokens; see docs/inference.md), all run by
// moe/'s agrs path with the route map of moe/route_map (sources: the ranks whose tokens are gathered;
// destinations: the layout's expert partitions, each of ep_tp_size ranks holding intermediate shards):
//  prefill  input in sequence-parallel (SP) layout [T/TP, d] (attention ends in a reduce-scatter over TP)
//           router on the local rows -> route counts exchanged over TP (the EP group with cross-DP EP)
//           -> all-gather [hidden | routes | weights] over TP (-> and over DP with cross-DP EP) -> the
//           experts of this rank's partition on their rows -> (reduce-scatter over DP) -> reduce-scatter
//           over TP back to SP.
//  decode   input [T, d] on every TP rank (attention ends in an all-reduce over TP), routed alike on each
//           (with cross-DP EP: route counts exchanged and an all-gather over DP) -> the experts of this
//           rank's partition -> all-reduce over TP (-> reduce-scatter over DP).
//           "DP" here is the DP replicas of this rank's EP group (InferenceGroup::EpDp): all of them with
//           ep_degree = TP*DP, g of them with ep_degree = g*TP (partial cross-DP EP, each group of g
//           replicas holding its own copy of the experts).
//  decode with EngineOptions::decode_moe = Rowwise (whole experts on every rank: ep_degree a multiple of TP):
//           each TP rank takes its contiguous slice of the replica's T tokens (some ranks may get none),
//           routes it, PUTs each routed row into its expert owner's symmetric dispatch buffer
//           (moe/paths/rowwise), runs its local experts, GETs the K output rows back and merges them in k
//           order, then an all-gather over TP gives every rank [T, d] again. The EP group is this rank's copy
//           of the experts (the whole world with ep_degree = TP*DP), so with cross-DP EP its replicas' tokens
//           meet at the experts without the DP all-gather/reduce-scatter.
// One sum over the TP group adds both the EP contributions (other experts) and the TP partial products
// (other intermediate shards) — seed 002, "Why a Single All-Reduce Works". The shared expert is TP-sharded
// and its partial sums ride in the same collective.
//
// Every rank of the world calls prefill/decode together, in the same phase; ranks of one DP replica pass
// the same sequences and tokens. A replica with nothing to do passes no sequences: it runs a dummy step
// with zero tokens that still takes part in every collective (seed 002's DP padding), so its peers never
// wait.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/core/product_precision.hpp"
#include "expar/infer/rank_weights.hpp"
#include "expar/moe/moe_forward.hpp"
#include "expar/nn/rope.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar {
class ExpertPath;
}

namespace expar::infer {

// How decode steps run the MoE layers (prefill always uses the all-gather/reduce-scatter pattern).
//  AllReduce  seed 002's decode: every rank runs its experts on every token, one all-reduce over TP.
//  Rowwise    the rowwise EP path (seed 000 §5.4-5.7): each rank routes its slice of the tokens, rows go to
//             their experts' owners and back, an all-gather over TP restores [T, d]. Full EP only.
enum class DecodeMoe : uint8_t { AllReduce, Rowwise };
DecodeMoe decode_moe_from_name(const std::string& name);  // "allreduce" | "rowwise"
std::string decode_moe_name(DecodeMoe mode);
// Both names (the choices of the command line's --decode-moe).
std::vector<std::string> decode_moe_names();

// Which rows of a prefill's logits are computed (the LM head is about a fifth of a prefill's FLOPs at
// hidden 1024, half at hidden 512, so a caller that samples computes only what it samples from).
//  LastRow  the last new token of each sequence: logits [ids.size(), V] (generation, serving).
//  AllRows  every new token: logits [Σ tokens, V] (evaluation, tests against a reference).
enum class PrefillLogits : uint8_t { LastRow, AllRows };

struct EngineOptions {
  DecodeMoe decode_moe = DecodeMoe::AllReduce;
  // Latent attention (DeepSeek): which form every step runs; unset, prefill expands the latents into keys and
  // values (its products are matrix products over many tokens) and decode runs the absorbed form (a step
  // reads the compressed cache once). The two give the same logits (tests compare them).
  std::optional<nn::LatentForm> latent_form;
  // The weight products' operands for every step (core/product_precision.hpp): BF16 rounds the activations of
  // the products over narrow weights to BF16 and multiplies BF16 weights on the CPU's BF16 dot products;
  // refused where the CPU has none.
  ProductPrecision precision = ProductPrecision::F32;
};

// Throws expar::Error unless `layout` supports `mode`: Rowwise needs every expert whole on one rank
// (ep_tp_size 1: ep_degree a multiple of TP, or a single rank); the message names the rule and the fix.
void check_decode_moe(const InferenceLayout& layout, DecodeMoe mode);

struct EngineStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // this replica's tokens
  double prefill_seconds = 0.0, decode_seconds = 0.0;
  // [E] token rows each expert computed on this rank, over all layers and steps (its shard of them under
  // variable EP or no EP): the routing load the server's metrics show per rank.
  std::vector<int64_t> expert_tokens;
  // [layers] local experts that got at least one row on this rank, per layer, summed over the steps: how
  // many experts' weights this rank read. A benchmark's bandwidth limit for the routes a run actually took
  // uses it per layer, because the ranks wait for each other at every MoE layer's collective.
  std::vector<int64_t> expert_weight_reads;
  // [layers] token rows this rank's experts computed per layer, over the steps: the layer's load on this
  // rank (a server's imbalance per layer compares it across ranks).
  std::vector<int64_t> layer_rows;
  // [layers][E] the same rows per logical expert: each MoE layer's expert load, from which a server places
  // that layer's replicas (empty rows for a dense layer stay zero).
  std::vector<std::vector<int64_t>> layer_expert_tokens;
};

class Engine {
 public:
  // world: the TP*DP ranks of `layout` (collective: builds the TP and DP groups). weights: this rank's
  // (load_rank_weights with the same layout and world rank). options: the same on every rank (decode_moe
  // Rowwise also builds a symmetric heap over the world, collectively).
  Engine(const InferenceLayout& layout, Comm& world, RankWeights weights, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const RankWeights& weights() const { return weights_; }
  int dp_rank() const { return dp_rank_; }
  // A new sequence with room for `capacity` tokens (at most the model's max_seq); returns its id.
  // Local: every rank of the replica must add the same sequences in the same order.
  int add_sequence(int64_t capacity);
  void remove_sequence(int id);
  int64_t length(int id) const;

  // Runs tokens[i] (one or more) of sequence ids[i] through the model; returns the logits `which` asks for,
  // in order, on every rank of the replica (full rows [., V] although each TP rank computes only its
  // vocabulary slice). Collective over the world; every rank of a replica passes the same `which`.
  Tensor prefill(std::span<const int> ids, const std::vector<std::vector<int32_t>>& tokens,
                 PrefillLogits which = PrefillLogits::AllRows);
  // One new token per sequence; returns logits [ids.size(), V]. Collective over the world.
  Tensor decode(std::span<const int> ids, std::span<const int32_t> tokens);

  // Moves the experts of each listed MoE layer to its slot table (the layout's with_expert_slots rules):
  // that layer's expert weights go, as held, to the ranks of its new placement over the EP group
  // (moe/expert_moves.hpp), then the route map places the layer's rows by it, the layer's replica deal
  // starting again at each expert's first replica; layers not listed keep theirs.
  // Every copy of the experts moves inside itself, so every rank must pass the same tables in the same order
  // (the server decides them once from the loads of the whole world). Collective over the world, between
  // steps (no step in flight); needs expert parallelism. Returns the weight bytes this rank received.
  int64_t move_experts(const std::vector<LayerSlotTable>& tables);
  // The placement of MoE layer `layer`'s experts: the layout's until move_experts gives it another.
  const ExpertPlacement& placement(int layer) const;
  const InferenceLayout& layout() const { return layout_; }

  const EngineStats& stats() const { return stats_; }
  // The collective groups (tests count calls on them); the DP group is the replicas of this rank's EP group
  // that exchange tokens (single ranks without cross-DP EP).
  Comm& tp_group() { return *tp_; }
  Comm& dp_group() { return *dp_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct Sequence;
  Tensor step(std::span<const int> ids, const std::vector<std::vector<int32_t>>& tokens, bool prefill,
              PrefillLogits which);
  // The embeddings [rows, d] of flat[first, first + rows), from this rank's vocabulary rows: under TP every
  // rank looks up all `flat` tokens in its slice (zero rows for the others) and the sum over the TP group
  // (reduce-scatter to the SP rows in prefill, all-reduce in decode) completes them. Exact: one addend is
  // the row, the others +0.
  Tensor embed(const std::vector<int32_t>& flat, int64_t first, int64_t rows, bool prefill);
  // Logits [N, V] of hidden rows x [N, d] (the same on every TP rank): this rank's vocabulary slice, then an
  // all-gather over TP.
  Tensor lm_head(const Tensor& x);
  // The MoE block of `layer` on moe/'s agrs path (seed 002's collectives per phase). Prefill: x is this
  // rank's SP rows and the result its SP rows; decode: x is the replica's tokens, on every TP rank.
  Tensor moe_agrs(int layer, const Tensor& x, bool prefill);
  Tensor moe_decode_rowwise(int layer, const Tensor& x);
  // The layer's MoE weights as moe/'s forward reads them, and that forward (dropless, no activations kept)
  // counting each local expert's rows into stats_.
  MoeWeights moe_weights(int layer) const;
  Tensor moe_forward_counted(int layer, const Tensor& x, const MoeForwardOptions& options);
  void shared_expert(int layer, const Tensor& x, float* out) const;
  // A dense layer's MLP (its TP shard, summed over TP): prefill's SP rows in and out (gathered, then
  // reduce-scattered; sp_rows: every TP rank's), decode's replica tokens in and out (all-reduced).
  Tensor dense_mlp(int layer, const Tensor& x, bool prefill, const std::vector<int64_t>& sp_rows);

  InferenceLayout layout_;
  EngineOptions options_;
  RankWeights weights_;
  std::shared_ptr<Comm> tp_, dp_;
  // The layout's EP group (with cross-DP EP or decode_moe Rowwise: the ranks of this rank's copy of the
  // experts): rowwise decode and cross-DP prefill route over it, move_experts moves weights over it.
  std::shared_ptr<Comm> ep_;
  std::unique_ptr<ExpertPath> prefill_path_, decode_path_;  // agrs over TP (and DP), see moe_agrs
  std::unique_ptr<ExpertPath> rowwise_;                     // decode_moe Rowwise: the rowwise path over ep_
  int rank_, tp_rank_, dp_rank_;
  int partition_;  // this rank's expert partition (the layout's ep_rank)
  // [layers] each layer's placement (a dense layer keeps the layout's, unused) and this rank's logical
  // experts in its local slot order (what the layer's weights hold).
  std::vector<ExpertPlacement> placements_;
  std::vector<std::vector<int>> local_experts_;
  nn::Rope rope_;
  std::vector<std::unique_ptr<Sequence>> sequences_;
  EngineStats stats_;
  // [layers] each MoE layer's replica deal (moe/replica_deal.hpp), prefill and decode alike: a step's route
  // map continues where the layer's previous one stopped, so batch-1 decode's routes to a replicated expert
  // go to its replicas in turn. Every rank that builds a layer's maps from the same gathered requests (the
  // replica's TP ranks; the EP group with cross-DP EP or rowwise decode) keeps the same deal.
  std::vector<ReplicaDeal> replica_deals_;
};

}  // namespace expar::infer
