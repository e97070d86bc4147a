#pragma once
// Execution paths (contracts 1-5 of docs/design.md). A path ONLY MOVES ROWS between a source rank's tokens
// and the expert-side buffers of the EP group; routing, capacity, the route map, the expert MLP and the
// per-route arithmetic (route_rows.hpp) are shared, so every path gives bit-identical results for the same
// inputs.
//
// One layer step calls, in this order:
//   forward:  in  = dispatch_forward(x)                  [capacity_rows, d], rows [0, recv_rows) written
//                                                        (encoded rows with a non-f32 dispatch precision)
//             out = expert_output_buffer()               where the expert MLP writes rows [0, recv_rows)
//             y   = combine_forward(out, topk_weight)    [T, d]
//   backward: g_out = combine_backward(grad_y, topk_weight, &grad_topk_weight)  [capacity_rows, d]
//             g_in  = expert_grad_input_buffer()         where the expert MLP backward writes its rows
//             grad_x = dispatch_backward(g_in)           [T, d]
// Tails [recv_rows, capacity_rows) of the expert-side tensors are never written or read by anyone.
// The two *_buffer hooks let a path hand out memory its peers can reach (symmetric buffers) so that the
// combine/dispatch backward can GET rows straight from where the experts wrote them; the default allocates.
//
// Wave schedules (seed 000 §5.9, moe/waves.hpp): a path whose traits say `waves` also runs each pass one
// wave at a time (a wave: the routes to a range of local experts, contiguous rows on every expert rank):
//   forward:  in = dispatch_forward_begin(x)          the expert-side buffer, no row moved yet
//             out = expert_output_buffer()
//             dispatch_forward_wave(x, w)             for each wave w in order: its rows are in `in` on
//             return combine_forward_wave(out, w)            after the experts of wave w wrote `out` y =
//             combine_forward_end(topk_weight)    the k-order merge, once every wave arrived
//   backward: g_out = combine_backward_begin(grad_y, topk_weight, &grad_topk_weight)
//             g_in = expert_grad_input_buffer()
//             combine_backward_wave(grad_y, topk_weight, w)   its rows are in g_out on return
//             dispatch_backward_wave(g_in, w)         after the expert backward of wave w wrote g_in
//             grad_x = dispatch_backward_end()        the k-order sum, once every wave arrived
// with PathState::waves set before dispatch_forward_begin. Every rank runs the same calls in the same order;
// the *_wave calls may run on another thread than the rest (the layer's communication thread), one at a
// time, while the experts of another wave run, so a wave call touches only its own wave's rows. The sums
// and merges over k are the same code as the single-call passes, so the results are bit-identical.
//
// A new path is one file under moe/paths/ plus one line in paths/registry.cpp.
#include <memory>
#include <string>
#include <vector>

#include "expar/core/tensor.hpp"
#include "expar/moe/paths/route_rows.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/route_map.hpp"
#include "expar/moe/waves.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

class Comm;
class SymmetricHeap;
class LeasePool;

// What a path keeps between its passes of one layer step (saved with the layer's state).
struct PathState {
  // Expert output rows as the source's routes see them, kept by combine_forward for the weight gradient
  // in combine_backward (local: the expert-side buffer itself; EP paths: the rows gathered to the source).
  RouteRows combine_rows;
  // Anything else a path keeps (buffer leases, peer-packed buffers, ...), owned by the path's code.
  std::shared_ptr<void> path_data;
  // Set by the caller before dispatch_forward: the dispatch payload is NOT saved for a later backward (the
  // caller recomputes it right before the backward that reads it, or runs no backward), so a path may put it
  // in storage shared across blocks (rowwise: the lease pool's dispatch scratch slot instead of a lease,
  // seed 000 §5.7). The path must still guard its backward reads (the pool's generation check).
  bool scratch_dispatch = false;
  // Set by the caller before dispatch_forward: the microbatch this step belongs to (-1: none, e.g. an
  // evaluation forward), carried by the step's lease tags into the pool's messages.
  int microbatch = -1;
  // Set by the caller before dispatch_forward_begin: the waves of a wave schedule (empty: the single-call
  // passes, no waves).
  std::vector<ExpertWave> waves;
  // agrs only (inference, seed 002), all optional.
  struct Agrs {
    // Set before dispatch_forward: the router weights [T, K]; they then travel in dispatch's gather with
    // the rows and routes, and combine_forward uses that copy (its topk_weight argument must be the same).
    const Tensor* topk_weight = nullptr;
    // Set by dispatch_forward: the gathered tokens [N, d] of every source, source-major.
    Tensor gathered_tokens;
    // Set before combine_forward: this rank's own partial output rows, added to the partial sum right
    // before its reduction over level `addend_level` (AgrsLevel index), at row `addend_row` of the partial
    // as it stands then (a TP-sharded shared expert rides the TP reduction; joining it after the DP
    // reduce-scatter keeps a token's sums the same on either DP replica).
    Tensor combine_addend;
    int64_t addend_row = 0;
    int addend_level = 0;
  } agrs;
};

// One level of the agrs path's collectives (inner first). A gathering level's ranks hold different tokens:
// dispatch all-gathers over it and combine reduce-scatters. A replicated level's ranks hold the same tokens:
// nothing is gathered and combine all-reduces. Seed 002's cross-DP EP prefill is {TP gathering, DP
// gathering} (all-gather TP then DP; reduce-scatter DP then TP), its decode {TP replicated, DP gathering}
// (all-gather DP; all-reduce TP, then reduce-scatter DP). The route map's sources are the gathering levels'
// ranks, ordered outer-major (source = Σ index_j · size of the gathering levels inside j).
struct AgrsLevel {
  Comm* group = nullptr;
  bool replicated = false;
};

struct PathOptions {
  int64_t model_dim = 0;  // d
  int top_k = 0;          // K
  const ExpertPlacement* placement = nullptr;
  // rowwise, aggregated (PathTraits::shared_heap): a symmetric heap over the EP group and a lease pool on it,
  // shared by the MoE blocks of a model (null: the path makes its own heap with ep_group.make_heap() and its
  // own pool). block_index tags the
  // leases of this block in the pool's messages.
  SymmetricHeap* heap = nullptr;
  LeasePool* lease_pool = nullptr;
  int block_index = -1;
  // agrs: the decode form (every rank of the EP group already holds the same tokens; one all_reduce sums
  // the ranks' partial outputs). The registry name "agrs-decode" sets it.
  bool agrs_decode = false;
  // agrs: the collective levels, inner first (empty: the one level {ep_group, agrs_decode}).
  std::vector<AgrsLevel> agrs_levels;
  // The format of each row movement (moe/payload_precision.hpp). block, rowwise and aggregated take any;
  // local and agrs refuse anything but f32. With a non-f32 dispatch, dispatch_forward returns the ENCODED
  // expert-side rows (payload_tensor's u8 layout) and the expert MLP decodes them; every other pass keeps its
  // f32 interface.
  PayloadPrecision precision;
};

// Bytes of one rowwise symmetric slot: capacity_rows rows of the largest encoded row of the four legs (a
// slot carries the dispatch payload, the expert outputs and their gradients, or the input gradients).
size_t rowwise_slot_bytes(int64_t capacity_rows, int64_t d, const PayloadPrecision& precision);

// The lease pool whose slots (rowwise_slot_bytes) a one-sided path's step of capacity_rows rows uses: the
// shared options.lease_pool (an internal error when its slots are too small), else `own`, made on `heap` or
// replaced by a larger one (rounded up to a power of two of rows) and named "<path><block>.gen<generation>".
// capacity_rows is the same on every member, so every member makes the same choice and allocates together.
LeasePool& step_lease_pool(const std::string& path, const PathOptions& options, SymmetricHeap& heap,
                           int64_t capacity_rows, int64_t d, std::shared_ptr<LeasePool>& own,
                           int& generation);
// Throws expar::Error unless `precision` is all f32: for a path that does not encode its rows.
void require_f32_payloads(const std::string& path, const PayloadPrecision& precision);

// The symmetric heap a one-sided path moves its rows through: options.heap when given (refused unless it was
// made by ep_group), else a new one from ep_group.make_heap(), kept in `own`.
SymmetricHeap& path_heap(const std::string& path, Comm& ep_group, const PathOptions& options,
                         std::unique_ptr<SymmetricHeap>& own);

// Throws expar::Error unless `map` is the route map of this rank of ep_group and x is f32 [map.tokens, d].
void check_dispatch_input(const std::string& path, const Comm& ep_group, const RouteMap& map,
                          const Tensor& x);

class ExpertPath {
 public:
  virtual ~ExpertPath() = default;
  virtual std::string name() const = 0;

  // x [T, d] -> expert-side input [capacity_rows, d] in contract-3 layout (rows [0, recv_rows) written).
  virtual Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) = 0;
  // Expert output rows -> y [T, d] = merge_routes (Σ_k w[t,k]·out(route t,k) in k order, dropped = 0).
  virtual Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                                 PathState& state) = 0;
  // grad_y [T, d] -> gradient of the expert output rows (w·grad_y at each route's row, rows [0, recv_rows)),
  // and grad_topk_weight [T, K] = route_weight_grads (dot(grad_y[t], out(route t,k)), 0 for dropped).
  virtual Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                                  PathState& state, Tensor& grad_topk_weight) = 0;
  // Gradient of the expert input rows -> grad_x [T, d] = sum_routes (Σ_k grad_in(route t,k) in k order).
  virtual Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) = 0;

  // Where the expert MLP writes its output rows / its input-gradient rows ([capacity_rows, d]).
  virtual Tensor expert_output_buffer(const RouteMap& map, int64_t d, PathState& state);
  virtual Tensor expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState& state);

  // The wave passes (see the top of this file). The defaults throw expar::Error: the path has no waves.
  virtual Tensor dispatch_forward_begin(const Tensor& x, const RouteMap& map, PathState& state);
  virtual void dispatch_forward_wave(const Tensor& x, const RouteMap& map, PathState& state, int wave);
  virtual void combine_forward_wave(const Tensor& expert_out, const RouteMap& map, PathState& state,
                                    int wave);
  virtual Tensor combine_forward_end(const Tensor& topk_weight, const RouteMap& map, PathState& state);
  virtual Tensor combine_backward_begin(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                                        PathState& state, Tensor& grad_topk_weight);
  virtual void combine_backward_wave(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                                     PathState& state, int wave);
  virtual void dispatch_backward_wave(const Tensor& grad_expert_in, const RouteMap& map, PathState& state,
                                      int wave);
  virtual Tensor dispatch_backward_end(const RouteMap& map, PathState& state);
};

// What the parametrized tests and the benchmarks need to know about a path, registered with it, so that a
// new path is tested and benchmarked by adding its registry line.
struct PathTraits {
  std::string name;
  bool single_rank = false;         // needs an EP group of 1 (local)
  bool same_rows_as_block = false;  // moves the same rows into the same places: bit-identical to block
  bool reduced_precision = false;   // takes non-f32 payloads (PathOptions::precision)
  bool decode_form = false;         // every rank of the group holds the group's tokens (agrs-decode)
  bool waves = false;               // runs the wave passes (MoeExecution::waves > 1)
  // Takes PathOptions::heap and lease_pool: a model gives every MoE block of this path the same heap and
  // pool (MoeTransformer), so that the blocks' symmetric slots are shared instead of one set per block.
  bool shared_heap = false;
};

// The registry, the single list of paths: "local" (EP size 1), "block", "rowwise", "agrs", "agrs-decode",
// "aggregated".
// make_path throws expar::Error naming the known paths for an unknown name.
std::unique_ptr<ExpertPath> make_path(const std::string& name, Comm& ep_group, const PathOptions& options);
const std::vector<PathTraits>& path_registry();
std::vector<std::string> path_names();
// The paths whose `trait` is set (e.g. &PathTraits::waves), in registry order, joined by " or ": the choices
// an error that refuses a path names.
std::string paths_with(bool PathTraits::*trait);
// The same names as a list (the choices a command-line flag accepts).
std::vector<std::string> path_names_with(bool PathTraits::*trait);
// Throws expar::Error naming the known paths for an unknown name.
const PathTraits& path_traits(const std::string& name);

}  // namespace expar
