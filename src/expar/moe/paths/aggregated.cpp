// The `aggregated` path: node-aggregated EP over symmetric memory (seed 000 §5.8, in the spirit of DeepEP's
// internode kernels). Across nodes every message is a NIC request, so the rows a source rank sends to the
// ranks of another node travel as ONE message per (source rank, destination node) and leg; inside a node
// rows move over shared memory as in the rowwise path.
//
// Proxies: the rows of source s for node n (≠ s's node) go to the member of n with s's index on its own node
// (modulo n's size): proxy(s, n). Every rank knows every message's size and place from the route map's
// accepted matrix (identical on every rank), so no count or split list is exchanged and none reaches the
// model's code: the block of s for n holds its accepted rows to n's ranks ordered by (destination rank,
// dst_row), which is, per member r of n and local expert e of r, accepted[s][e] rows that land contiguously
// at r's dst rows offset(r, e) + Σ_{q<s} accepted[q][e] (contract 3). The proxy forwards each such run.
//
//   dispatch forward  source: rows to its own node are stored at dst_row of their rank (as rowwise: a load/
//                     store where mapped, a put otherwise); rows to node n are packed and PUT as one block
//                     into proxy(s, n)'s pack buffer; barrier; proxy: each run of each block it holds is
//                     stored into the dispatch slot of its rank; barrier; the experts read the slot in place.
//   combine forward   the experts wrote their rows into the symmetric output buffer; barrier; sources read
//                     their own node's rows in place; each proxy packs, per source it serves, that source's
//                     rows from its node's output buffers into its pack buffer; barrier; each source GETs one
//                     block per other node and unpacks it to [T, K, d]; merge_routes.
//   combine backward  the adjoint of combine forward, moving like dispatch forward: w·grad_y rows PUT as one
//                     block per node, forwarded by the proxy into the output-gradient rows (the output buffer
//                     again), which the expert backward reads in place.
//   dispatch backward the adjoint of dispatch forward, moving like combine forward: the expert input
//                     gradients are packed by the proxies and fetched with one GET per node; sum_routes.
// The per-route arithmetic is route_rows.hpp's, so results are bit-identical to block and rowwise.
//
// Buffers (symmetric, identical in size on every member because they are sized from the accepted matrix):
// slots of a LeasePool (step_lease_pool: the model's pool shared by all its MoE blocks, as rowwise's, or the
// path's own) and this block's `pack` buffer [the most rows any proxy holds] (the blocks, grown by powers of
// two). The dispatch slot [capacity_rows] is LEASED per step (seed 000 §5.7: the up-projection reads it again
// for Wgrad, so it must survive other blocks' and microbatches' passes) and released by dispatch backward (or
// when a step without backward is dropped); `output` (expert outputs, then their gradients) is the pool's
// shared scratch slot kOutputScratch and `grad_in` (expert input gradients) a lease from expert backward to
// the end of dispatch backward: both serve one block's passes only, so the blocks share them. Hazards, given
// that every rank runs the same passes in the same order: every pass starts with a barrier, so nobody
// touches a buffer that a peer's previous pass (of this block or another) still reads; after a pass's last
// barrier only the pack buffers are still read (the GETs of combine forward and dispatch backward), and no
// pass writes a pack buffer before its first barrier. The experts write `output` between dispatch forward
// and combine forward and `grad_in` between combine backward and dispatch backward, when no peer accesses
// them; peers write a dispatch slot only in the dispatch forward that leased it.
// Payload precision (PathOptions::precision): each leg moves rows encoded where they leave (the dispatch rows
// once per token, the w·grad_y rows per route, the expert rows by their rank into its symmetric buffer) and
// decoded where they are consumed, as in rowwise; the experts read the encoded dispatch slot in place.
// Wave passes (moe/waves.hpp): each wave moves the routes to its local experts as the passes above do, with
// its own blocks (make_moves over the wave's experts: one message per source, node and wave), so a wave's
// rows land in its rows of every expert-side buffer while the experts of another wave read or write theirs.
// The waves reuse the pack buffer one after another: the wave calls run one at a time (on the layer's
// communication thread when overlapped), and every one, like every pass, starts with a barrier before
// anything writes a pack buffer.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"
#include "expar/moe/symmetric_budget.hpp"

namespace expar {

namespace {

// The EP group's nodes: each node's members in group-rank order and each member's index on its node.
struct NodeLayout {
  std::vector<int> node_of;               // [M]
  std::vector<int> index_on_node;         // [M]
  std::vector<std::vector<int>> members;  // [nodes]

  explicit NodeLayout(const NodeMap& nodes, int m) {
    // A group without node information (a test's solo Comm) is one node.
    const bool known = static_cast<int>(nodes.node_of.size()) == m;
    members.resize(static_cast<size_t>(known ? nodes.num_nodes : 1));
    for (int r = 0; r < m; ++r) {
      const int n = known ? nodes.node_of[static_cast<size_t>(r)] : 0;
      node_of.push_back(n);
      index_on_node.push_back(static_cast<int>(members[static_cast<size_t>(n)].size()));
      members[static_cast<size_t>(n)].push_back(r);
    }
  }
  // The member of `node` that takes and returns the rows of `source` (on another node).
  int proxy(int source, int node) const {
    const auto& on = members[static_cast<size_t>(node)];
    return on[static_cast<size_t>(index_on_node[static_cast<size_t>(source)]) % on.size()];
  }
};

// Contiguous expert-side rows [row, row + rows) of member `rank`: one (source, local expert) of a block.
struct Run {
  int rank = 0;
  int64_t row = 0, rows = 0;
};

// One message of a leg: rows [offset, offset + rows) of the proxy's pack buffer.
struct Block {
  int peer = 0;  // as the source: the proxy; as the proxy: the source
  int64_t offset = 0, rows = 0;
  std::vector<int64_t> routes;  // as the source: its routes (t*K + k) in block order
  std::vector<Run> runs;        // as the proxy: where the block's rows land, in block order
};

// A step's movements, derived from the route map once in dispatch forward (the map is saved for backward).
struct Moves {
  std::vector<int64_t> node_routes;  // valid routes to ranks on this rank's node, in (t, k) order
  std::vector<Block> sent;           // this rank's blocks, one per other node it has rows for
  std::vector<Block> held;           // the blocks this rank forwards as a proxy, one per source with rows
  int64_t pack_rows = 0;             // rows of the largest pack buffer of the group this step
};

// The routes and local experts one pass moves: every one, or those of one wave (moe/waves.hpp).
struct MoveFilter {
  ExpertWave experts;                // local experts [begin, end) of every member
  const int32_t* wave_of = nullptr;  // [T*K]: the wave of each route (null: every route)
  int wave = 0;
  bool take(int64_t route) const { return wave_of == nullptr || wave_of[route] == wave; }
};

Moves make_moves(const RouteMap& map, const ExpertPlacement& placement, const NodeLayout& nodes,
                 const MoveFilter& filter) {
  const int m = map.ep_size, me = map.ep_rank, e_count = map.num_slots, e_local = placement.local_count();
  const int my_node = nodes.node_of[static_cast<size_t>(me)];
  // offset[r][l]: first row of member r's local slot l; before[s][e]: rows of slot e from sources < s.
  std::vector<std::vector<int64_t>> offset(static_cast<size_t>(m));
  for (int r = 0; r < m; ++r) {
    int64_t at = 0;
    for (int l = 0; l < e_local; ++l) {
      offset[static_cast<size_t>(r)].push_back(at);
      for (int s = 0; s < m; ++s) at += map.accepted_of(s, placement.slot(r, l));
    }
  }
  std::vector<int64_t> before(static_cast<size_t>(m) * e_count, 0);
  for (int s = 1; s < m; ++s)
    for (int e = 0; e < e_count; ++e)
      before[static_cast<size_t>(s) * e_count + e] =
          before[static_cast<size_t>(s - 1) * e_count + e] + map.accepted_of(s - 1, e);
  auto rows_for = [&](int s, int n) {
    int64_t rows = 0;
    for (int r : nodes.members[static_cast<size_t>(n)])
      for (int l = filter.experts.begin; l < filter.experts.end; ++l)
        rows += map.accepted_of(s, placement.slot(r, l));
    return rows;
  };

  Moves step;
  // Each proxy's pack buffer holds the blocks of the sources it serves, in source order.
  std::vector<int64_t> pack_at(static_cast<size_t>(m), 0);
  std::vector<int64_t> my_offset(nodes.members.size(), 0);
  for (int s = 0; s < m; ++s)
    for (int n = 0; n < static_cast<int>(nodes.members.size()); ++n) {
      if (n == nodes.node_of[static_cast<size_t>(s)]) continue;
      const int p = nodes.proxy(s, n);
      const int64_t rows = rows_for(s, n);
      if (s == me) my_offset[static_cast<size_t>(n)] = pack_at[static_cast<size_t>(p)];
      if (p == me && rows > 0) {
        Block held{s, pack_at[static_cast<size_t>(p)], rows, {}, {}};
        for (int r : nodes.members[static_cast<size_t>(n)])
          for (int l = filter.experts.begin; l < filter.experts.end; ++l) {
            const int e = placement.slot(r, l);
            const int64_t a = map.accepted_of(s, e);
            if (a > 0)
              held.runs.push_back({r,
                                   offset[static_cast<size_t>(r)][static_cast<size_t>(l)] +
                                       before[static_cast<size_t>(s) * e_count + e],
                                   a});
          }
        step.held.push_back(std::move(held));
      }
      pack_at[static_cast<size_t>(p)] += rows;
    }
  step.pack_rows = *std::max_element(pack_at.begin(), pack_at.end());

  // This rank's routes: to its own node directly, to another node in (destination rank, dst_row) order.
  std::vector<std::vector<int64_t>> to_node(nodes.members.size());
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k) {
      if (!map.valid(t, k) || !filter.take(t * map.top_k + k)) continue;
      const int n = nodes.node_of[static_cast<size_t>(map.rank_of(t, k))];
      (n == my_node ? step.node_routes : to_node[static_cast<size_t>(n)]).push_back(t * map.top_k + k);
    }
  const int32_t* rank = map.dst_rank.data<int32_t>();
  const int32_t* row = map.dst_row.data<int32_t>();
  for (size_t n = 0; n < to_node.size(); ++n) {
    std::vector<int64_t>& routes = to_node[n];
    if (routes.empty()) continue;
    std::sort(routes.begin(), routes.end(),
              [&](int64_t a, int64_t b) { return rank[a] != rank[b] ? rank[a] < rank[b] : row[a] < row[b]; });
    const auto rows = static_cast<int64_t>(routes.size());
    EXPAR_ASSERT(rows == rows_for(me, static_cast<int>(n)),
                 "aggregated path: rank {} has {} routes to node {} but the accepted matrix says {}", me,
                 rows, n, rows_for(me, static_cast<int>(n)));
    step.sent.push_back({nodes.proxy(me, static_cast<int>(n)), my_offset[n], rows, std::move(routes), {}});
  }
  return step;
}

// The pool's shared scratch slot of the expert outputs and their gradients (LeasePool::acquire_scratch).
constexpr int kOutputScratch = 0;

// What one step keeps between its passes: its movements, its pool slots, and the f32 rows the experts write
// when their leg travels encoded (encoded into the symmetric slot by the next pass).
struct AggregatedStep {
  Moves moves;  // the single-call passes' movements (a wave step: empty)
  // Wave passes: where each wave's rows are, each wave's movements, the token rows encoded once for every
  // wave's dispatch (a reduced-precision dispatch), the [T, K, d] rows gathered so far (combine forward,
  // then dispatch backward) and the decoded expert-output gradient (a reduced-precision combine backward).
  WaveRoutes waves;
  std::vector<Moves> wave_moves;
  Tensor encoded_x, gathered, grad_out;
  int64_t pack_rows = 0;                // the most rows any pack buffer holds in one pass of this step
  std::shared_ptr<LeasePool> own_pool;  // keeps a replaced own pool alive while this step holds its leases
  LeasePool* pool = nullptr;
  LeaseTag tag;
  LeasePool::Handle payload;  // leased: the dispatch slot, read again by the expert backward
  LeasePool::Handle output;   // scratch: expert outputs (forward), their gradients (backward)
  LeasePool::Handle grad_in;  // leased: expert input gradients, from expert backward to dispatch backward
  Tensor expert_out, expert_grad_in;

  AggregatedStep() = default;
  AggregatedStep(const AggregatedStep&) = delete;
  AggregatedStep& operator=(const AggregatedStep&) = delete;
  // A step that never ran its backward gives its leases back when its state is dropped. Safe without a
  // barrier: peers wrote the dispatch slot only in its dispatch forward, and only this rank's experts read
  // it.
  ~AggregatedStep() {
    if (pool == nullptr) return;
    if (payload.leased) pool->release(payload);
    if (grad_in.leased) pool->release(grad_in);
  }
};

// Encoded rows: communication scratch.
Tensor byte_rows(int64_t rows, size_t row_bytes) {
  return Tensor::empty({rows, static_cast<int64_t>(row_bytes)}, DType::U8, MemCategory::CommScratch);
}

std::byte* bytes_of(const Tensor& t) {
  return static_cast<std::byte*>(const_cast<void*>(t.raw()));
}

class AggregatedPath final : public ExpertPath {
 public:
  AggregatedPath(Comm& ep_group, const PathOptions& options)
      : group_(ep_group),
        options_(options),
        nodes_(ep_group.nodes(), ep_group.size()),
        heap_(&path_heap("aggregated", ep_group, options, own_heap_)) {}

  std::string name() const override { return "aggregated"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    AggregatedStep& step = start_dispatch(x, map, state, false);
    start_pass({step.payload.buffer, pack_});
    send_dispatch_rows(x, map, step, step.moves);
    return borrow_payload(step.pool->data(step.payload), options_.precision.dispatch, map.capacity_rows,
                          x.dim(1));
  }

  Tensor dispatch_forward_begin(const Tensor& x, const RouteMap& map, PathState& state) override {
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    AggregatedStep& step = start_dispatch(x, map, state, true);
    start_pass({step.payload.buffer});  // each wave's rows land in the poisoned slot
    return borrow_payload(step.pool->data(step.payload), options_.precision.dispatch, map.capacity_rows,
                          x.dim(1));
  }

  void dispatch_forward_wave(const Tensor& x, const RouteMap& map, PathState& state, int wave) override {
    AggregatedStep& step = step_of(state, "dispatch forward");
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    start_pass({pack_});
    send_dispatch_rows(x, map, step, wave_moves_of(step, wave));
  }

  Tensor expert_output_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    AggregatedStep& owned = step_of(state, "expert_output_buffer");
    // No peer accesses this slot between dispatch forward's last barrier and combine forward's first.
    owned.output = owned.pool->acquire_scratch(owned.tag, kOutputScratch);
    return expert_side_buffer(owned.output.buffer, options_.precision.combine, map, d, owned.expert_out);
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    AggregatedStep& owned = step_of(state, "combine forward");
    const int64_t d = expert_out.dim(1);
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    ensure_pack(owned.pack_rows, d);
    const BufferId output = owned.output.buffer;
    stage_expert_rows(expert_out, output, options_.precision.combine, 0, map.recv_rows);
    owned.expert_out = Tensor();
    Tensor gathered;
    gather_routes(owned.moves, map, output, d, options_.precision.combine, gathered);
    state.combine_rows = RouteRows::gathered(std::move(gathered), map);
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  void combine_forward_wave(const Tensor& expert_out, const RouteMap& map, PathState& state,
                            int wave) override {
    AggregatedStep& owned = step_of(state, "combine forward");
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    stage_and_gather_wave(expert_out, map, owned, wave, owned.output.buffer, options_.precision.combine);
  }

  Tensor combine_forward_end(const Tensor& topk_weight, const RouteMap& map, PathState& state) override {
    AggregatedStep& owned = step_of(state, "combine forward");
    EXPAR_ASSERT(owned.gathered.defined(), "aggregated combine_forward_end before any combine_forward_wave");
    PhaseScope combine_phase(phase::kRowGatherReduce);
    owned.expert_out = Tensor();
    state.combine_rows = RouteRows::gathered(std::move(owned.gathered), map);
    owned.gathered = Tensor();
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    AggregatedStep& owned = start_combine_backward(grad_y, map, state, grad_topk_weight);
    const BufferId output = owned.output.buffer;
    start_pass({output, pack_});
    send_route_grads(grad_y, topk_weight, map, owned.moves, output);
    const PayloadFormat format = options_.precision.combine_grad;
    const int64_t d = grad_y.dim(1);
    // The expert backward reads f32 rows: decoded from the encoded ones that arrived.
    return decode_payload(borrow_payload(heap_->local(output), format, map.capacity_rows, d), format,
                          format == PayloadFormat::F32 ? map.capacity_rows : map.recv_rows, d);
  }

  Tensor combine_backward_begin(const Tensor& grad_y, const Tensor& /*topk_weight*/, const RouteMap& map,
                                PathState& state, Tensor& grad_topk_weight) override {
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    AggregatedStep& owned = start_combine_backward(grad_y, map, state, grad_topk_weight);
    start_pass({owned.output.buffer});  // each wave's rows land in the poisoned slot
    const int64_t d = grad_y.dim(1);
    if (options_.precision.combine_grad == PayloadFormat::F32)
      return Tensor::borrow(heap_->local(owned.output.buffer), {map.capacity_rows, d}, DType::F32);
    owned.grad_out = Tensor::empty({map.capacity_rows, d});  // each wave's rows are decoded as they arrive
    return owned.grad_out;
  }

  void combine_backward_wave(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                             PathState& state, int wave) override {
    AggregatedStep& owned = step_of(state, "combine backward");
    const Moves& moves = wave_moves_of(owned, wave);
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    start_pass({pack_});
    send_route_grads(grad_y, topk_weight, map, moves, owned.output.buffer);
    const PayloadFormat format = options_.precision.combine_grad;
    if (format == PayloadFormat::F32) return;
    const int64_t d = grad_y.dim(1), begin = owned.waves.row_begin(map.ep_rank, wave);
    const int64_t end = owned.waves.row_end(map.ep_rank, wave);
    const size_t rb = payload_row_bytes(format, d);
    decode_payload_rows(
        format,
        static_cast<const std::byte*>(heap_->local(owned.output.buffer)) + begin * static_cast<int64_t>(rb),
        end - begin, d, owned.grad_out.data<float>() + begin * d);
  }

 private:
  // Combine backward's set-up: the routing-weight gradient and the output slot again (expert-output
  // gradients now).
  AggregatedStep& start_combine_backward(const Tensor& grad_y, const RouteMap& map, const PathState& state,
                                         Tensor& grad_topk_weight) {
    AggregatedStep& owned = step_of(state, "combine backward");
    EXPAR_CHECK(state.combine_rows.defined(), "aggregated combine backward called before combine forward");
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    ensure_pack(owned.pack_rows, grad_y.dim(1));
    owned.output = owned.pool->acquire_scratch(owned.tag, kOutputScratch);
    return owned;
  }

  // One pass's w·grad_y rows (moves: every route or one wave's), encoded in the combine-gradient format, to
  // their dst_row of `output` on their expert rank: as dispatch forward moves the token rows.
  void send_route_grads(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                        const Moves& step, BufferId output) {
    const int64_t d = grad_y.dim(1);
    const PayloadFormat format = options_.precision.combine_grad;
    const size_t rb = payload_row_bytes(format, d);
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    const int k_count = map.top_k;
    std::vector<float> row(static_cast<size_t>(d));
    // One route's w·grad_y row, encoded in `format`, at `dst`.
    auto route_grad = [&](int64_t route, std::byte* dst) {
      if (format == PayloadFormat::F32) {
        weighted_route_grad(gy + (route / k_count) * d, w[route], reinterpret_cast<float*>(dst), d);
        return;
      }
      weighted_route_grad(gy + (route / k_count) * d, w[route], row.data(), d);
      encode_payload_rows(format, row.data(), 1, d, dst);
    };
    // Rows for this node: written in place where the peer is mapped, staged and put otherwise.
    Tensor staged = byte_rows(static_cast<int64_t>(step.node_routes.size()), rb);
    for (size_t i = 0; i < step.node_routes.size(); ++i) {
      const int64_t route = step.node_routes[i], t = route / k_count;
      const int k = static_cast<int>(route % k_count);
      std::byte* dst = bytes_of(staged) + static_cast<int64_t>(i * rb);
      if (void* base = heap_->peer_ptr(map.rank_of(t, k), output))
        dst =
            static_cast<std::byte*>(base) + static_cast<int64_t>(map.row_of(t, k)) * static_cast<int64_t>(rb);
      route_grad(route, dst);
      store_rows(map.rank_of(t, k), output, map.row_of(t, k), dst, 1, rb);
    }
    std::vector<Tensor> packed;
    for (const Block& b : step.sent) {
      packed.push_back(byte_rows(b.rows, rb));
      std::byte* out = bytes_of(packed.back());
      for (int64_t i = 0; i < b.rows; ++i)
        route_grad(b.routes[static_cast<size_t>(i)], out + i * static_cast<int64_t>(rb));
      store_rows(b.peer, pack_, b.offset, out, b.rows, rb);
    }
    heap_->barrier();  // every block is at its proxy
    forward_held(step, output, rb);
    heap_->barrier();  // every gradient row is at its dst_row
  }

 public:
  Tensor expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    AggregatedStep& owned = step_of(state, "expert_grad_input_buffer");
    // A fresh lease: no peer accesses it between combine backward's last barrier and dispatch backward's
    // first, and every peer's last access to the slot (another block's dispatch backward) ended before a
    // barrier we all passed.
    owned.grad_in = owned.pool->acquire(owned.tag);
    return expert_side_buffer(owned.grad_in.buffer, options_.precision.dispatch_grad, map, d,
                              owned.expert_grad_in);
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    AggregatedStep& owned = step_of(state, "dispatch backward");
    const int64_t d = grad_expert_in.dim(1);
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    check_grad_in(owned);
    ensure_pack(owned.pack_rows, d);
    stage_expert_rows(grad_expert_in, owned.grad_in.buffer, options_.precision.dispatch_grad, 0,
                      map.recv_rows);
    Tensor gathered;
    gather_routes(owned.moves, map, owned.grad_in.buffer, d, options_.precision.dispatch_grad, gathered);
    finish_dispatch_backward(owned);
    return sum_routes(RouteRows::gathered(std::move(gathered), map), map);
  }

  // A wave's route gradients are gathered to [T, K, d] as they become ready (the sum over k needs every
  // wave's rows, so it waits for dispatch_backward_end).
  void dispatch_backward_wave(const Tensor& grad_expert_in, const RouteMap& map, PathState& state,
                              int wave) override {
    AggregatedStep& owned = step_of(state, "dispatch backward");
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    check_grad_in(owned);
    stage_and_gather_wave(grad_expert_in, map, owned, wave, owned.grad_in.buffer,
                          options_.precision.dispatch_grad);
  }

  Tensor dispatch_backward_end(const RouteMap& map, PathState& state) override {
    AggregatedStep& owned = step_of(state, "dispatch backward");
    check_grad_in(owned);
    EXPAR_ASSERT(owned.gathered.defined(),
                 "aggregated dispatch_backward_end before any dispatch_backward_wave");
    PhaseScope dispatch_phase(phase::kRowDispatch);
    finish_dispatch_backward(owned);
    Tensor gathered = std::move(owned.gathered);
    owned.gathered = Tensor();
    return sum_routes(RouteRows::gathered(std::move(gathered), map), map);
  }

 private:
  // Where the experts write one leg's rows (poisoned first under EXPAR_POISON): the symmetric `buffer`
  // itself for an f32 leg, or an f32 staging tensor (kept in `staged`) that is encoded into it afterwards.
  Tensor expert_side_buffer(BufferId buffer, PayloadFormat format, const RouteMap& map, int64_t d,
                            Tensor& staged) {
    if (poison_enabled()) fill_nan(heap_->local(buffer), heap_->bytes(buffer));
    if (format != PayloadFormat::F32) {
      staged = Tensor::empty({map.capacity_rows, d});
      return staged;
    }
    return Tensor::borrow(heap_->local(buffer), {map.capacity_rows, d}, DType::F32);
  }

  static void check_grad_in(const AggregatedStep& owned) {
    EXPAR_ASSERT(owned.grad_in.leased,
                 "aggregated dispatch backward: the expert input gradient must be written into "
                 "expert_grad_input_buffer() (peers fetch the route gradients from it)");
  }

  // The expert backward, the dispatch slot's last reader, is done; after the last gather_routes' second
  // barrier no peer reads this rank's gradient slot any more: both slots go back.
  void finish_dispatch_backward(AggregatedStep& owned) {
    if (owned.payload.leased) owned.pool->release(owned.payload);
    owned.pool->release(owned.grad_in);
    owned.expert_grad_in = Tensor();
  }

  // Dispatch forward's set-up: the step and its movements (per wave for a wave step), the pack buffer, the
  // leased dispatch slot, and the token rows encoded once (a reduced precision) for every pass that sends
  // them.
  AggregatedStep& start_dispatch(const Tensor& x, const RouteMap& map, PathState& state, bool waves) {
    check_dispatch_input("aggregated", group_, map, x);
    const int64_t d = x.dim(1);
    auto owned = std::make_shared<AggregatedStep>();
    const ExpertPlacement& placement = *options_.placement;
    if (waves) {
      owned->waves = make_wave_routes(map, placement, state.waves);
      for (int w = 0; w < owned->waves.waves; ++w) {
        owned->wave_moves.push_back(make_moves(
            map, placement, nodes_, {state.waves[static_cast<size_t>(w)], owned->waves.wave_of.data(), w}));
        owned->pack_rows = std::max(owned->pack_rows, owned->wave_moves.back().pack_rows);
      }
    } else {
      owned->moves = make_moves(map, placement, nodes_, {{0, placement.local_count()}});
      owned->pack_rows = owned->moves.pack_rows;
    }
    state.path_data = owned;
    ensure_pack(owned->pack_rows, d);
    LeasePool& pool =
        step_lease_pool("aggregated", options_, *heap_, map.capacity_rows, d, own_pool_, pool_generation_);
    owned->pool = &pool;
    if (&pool != options_.lease_pool) owned->own_pool = own_pool_;
    owned->tag = {options_.block_index, state.microbatch};
    owned->payload = pool.acquire(owned->tag);
    const PayloadFormat format = options_.precision.dispatch;
    if (format != PayloadFormat::F32) {
      owned->encoded_x = byte_rows(map.tokens, payload_row_bytes(format, d));
      encode_rows(format, x.data<float>(), map.tokens, d, bytes_of(owned->encoded_x));
    }
    return *owned;
  }

  // One pass's token rows (moves: every route or one wave's) to their dst_row of the dispatch slot: rows to
  // this node stored directly, rows to another node packed into one block per node and PUT to its proxy,
  // which forwards them; returns once every row is in place.
  void send_dispatch_rows(const Tensor& x, const RouteMap& map, const AggregatedStep& owned,
                          const Moves& step) {
    const PayloadFormat format = options_.precision.dispatch;
    const size_t rb = payload_row_bytes(format, x.dim(1));
    const std::byte* src =
        static_cast<const std::byte*>(format == PayloadFormat::F32 ? x.raw() : owned.encoded_x.raw());
    const BufferId slot = owned.payload.buffer;
    for (int64_t route : step.node_routes) {
      const int64_t t = route / map.top_k;
      const int k = static_cast<int>(route % map.top_k);
      store_rows(map.rank_of(t, k), slot, map.row_of(t, k), src + t * static_cast<int64_t>(rb), 1, rb);
    }
    std::vector<Tensor> packed;  // the put sources stay alive until the barrier completes the puts
    for (const Block& b : step.sent) {
      packed.push_back(byte_rows(b.rows, rb));
      std::byte* out = bytes_of(packed.back());
      for (int64_t i = 0; i < b.rows; ++i)
        std::memcpy(out + i * static_cast<int64_t>(rb),
                    src + (b.routes[static_cast<size_t>(i)] / map.top_k) * static_cast<int64_t>(rb), rb);
      store_rows(b.peer, pack_, b.offset, out, b.rows, rb);
    }
    heap_->barrier();  // every block is at its proxy
    forward_held(step, slot, rb);
    heap_->barrier();  // every row is at its dst_row
  }

  // Combine forward and dispatch backward, one wave: the rows its experts wrote into this rank's `buffer`
  // (encoded there in `format`), then its routes gathered into the step's [T, K, d] rows.
  void stage_and_gather_wave(const Tensor& written, const RouteMap& map, AggregatedStep& owned, int wave,
                             BufferId buffer, PayloadFormat format) {
    const Moves& moves = wave_moves_of(owned, wave);
    stage_expert_rows(written, buffer, format, owned.waves.row_begin(map.ep_rank, wave),
                      owned.waves.row_end(map.ep_rank, wave));
    gather_routes(moves, map, buffer, written.dim(1), format, owned.gathered);
  }

  static const Moves& wave_moves_of(const AggregatedStep& owned, int wave) {
    EXPAR_ASSERT(wave >= 0 && wave < static_cast<int>(owned.wave_moves.size()),
                 "aggregated path: wave {} of a step planned with {} waves", wave, owned.wave_moves.size());
    return owned.wave_moves[static_cast<size_t>(wave)];
  }

  static AggregatedStep& step_of(const PathState& state, const char* pass) {
    EXPAR_CHECK(state.path_data != nullptr, "aggregated {} called before dispatch forward of the same step",
                pass);
    return *static_cast<AggregatedStep*>(state.path_data.get());
  }

  // Grows this block's pack buffer to hold `pack_rows` rows of the largest format of the four legs. The count
  // is the same on every member (the accepted matrix), so every member allocates together; a replaced buffer
  // stays allocated (the heap frees nothing), which the power-of-two growth bounds.
  void ensure_pack(int64_t pack_rows, int64_t d) {
    const size_t need = aggregated_pack_bytes(pack_rows, d, options_.precision);
    if (pack_ >= 0 && pack_bytes_ >= need) return;
    pack_bytes_ = need;
    pack_ = heap_->allocate(fmt::format("aggregated{}.pack.gen{}", options_.block_index, pack_generation_++),
                            pack_bytes_);
  }

  // A pass that peers write into: once nobody reads what an earlier pass left in these buffers (the
  // barrier), they are poisoned (where enabled) and the poison is in place before any row lands.
  void start_pass(std::initializer_list<BufferId> written) {
    heap_->barrier();
    if (!poison_enabled()) return;
    for (BufferId b : written) fill_nan(heap_->local(b), heap_->bytes(b));
    heap_->barrier();
  }

  // The experts' f32 rows [begin, end) (every row: [0, recv_rows); a wave: its rows) into this rank's
  // `buffer` in `format`: encoded from the staging tensor the buffer hook handed out, or (f32) copied unless
  // the experts wrote the buffer itself.
  void stage_expert_rows(const Tensor& written, BufferId buffer, PayloadFormat format, int64_t begin,
                         int64_t end) {
    auto* local = static_cast<std::byte*>(heap_->local(buffer));
    const int64_t d = written.dim(1);
    const int64_t rb = static_cast<int64_t>(payload_row_bytes(format, d));
    if (format != PayloadFormat::F32)
      encode_rows(format, written.data<float>() + begin * d, end - begin, d, local + begin * rb);
    else if (written.raw() != local)
      std::memcpy(local + begin * rb, written.data<float>() + begin * d,
                  static_cast<size_t>((end - begin) * d) * sizeof(float));
  }

  // Rows [row, row + rows) (of rb bytes) of member `peer`'s `buffer` = src: stores where the peer is mapped
  // (src may be the destination itself, then nothing moves), one put otherwise.
  void store_rows(int peer, BufferId buffer, int64_t row, const std::byte* src, int64_t rows, size_t rb) {
    const size_t offset = static_cast<size_t>(row) * rb, bytes = static_cast<size_t>(rows) * rb;
    if (void* base = heap_->peer_ptr(peer, buffer)) {
      std::byte* dst = static_cast<std::byte*>(base) + offset;
      if (dst != src) std::memcpy(dst, src, bytes);
    } else {
      heap_->put(peer, buffer, offset, src, bytes);
    }
  }

  // dst = rows [row, row + rows) (of rb bytes) of member `peer`'s `buffer`: loads where mapped, one get
  // otherwise (complete after quiet()).
  void load_rows(int peer, BufferId buffer, int64_t row, std::byte* dst, int64_t rows, size_t rb) {
    const size_t offset = static_cast<size_t>(row) * rb, bytes = static_cast<size_t>(rows) * rb;
    if (const void* base = heap_->peer_ptr(peer, buffer))
      std::memcpy(dst, static_cast<const std::byte*>(base) + offset, bytes);
    else
      heap_->get(peer, buffer, offset, dst, bytes);
  }

  // As a proxy: every run of every block it holds, from its pack buffer to the run's rank's `buffer`.
  void forward_held(const Moves& step, BufferId buffer, size_t rb) {
    const auto* pack = static_cast<const std::byte*>(heap_->local(pack_));
    for (const Block& b : step.held) {
      int64_t at = b.offset;
      for (const Run& run : b.runs) {
        store_rows(run.rank, buffer, run.row, pack + at * static_cast<int64_t>(rb), run.rows, rb);
        at += run.rows;
      }
    }
  }

  // Combine forward and dispatch backward: into `gathered` ([T, K, d] f32, made here if undefined), the row
  // of every route of `step` (every valid route, or one wave's) from `buffer` of its expert rank (encoded
  // there in `format`), where every expert rank already wrote those rows into its own `buffer`. Rows on this
  // node are read in place; each proxy packs the rows of the sources it serves; each source fetches one block
  // per other node; the rows are decoded where they arrive.
  void gather_routes(const Moves& step, const RouteMap& map, BufferId buffer, int64_t d, PayloadFormat format,
                     Tensor& gathered) {
    const size_t rb = payload_row_bytes(format, d);
    const bool f32 = format == PayloadFormat::F32;
    heap_->barrier();  // every expert rank's rows are in `buffer`; nobody reads a pack buffer any more
    if (poison_enabled()) fill_nan(heap_->local(pack_), heap_->bytes(pack_));  // only this rank writes it
    if (!gathered.defined()) gathered = Tensor::empty({map.tokens, map.top_k, d});
    float* out = gathered.data<float>();
    // f32 rows land at their (t, k) directly; encoded ones are staged and decoded after quiet().
    Tensor node_rows = byte_rows(f32 ? 0 : static_cast<int64_t>(step.node_routes.size()), rb);
    for (size_t i = 0; i < step.node_routes.size(); ++i) {
      const int64_t route = step.node_routes[i], t = route / map.top_k;
      const int k = static_cast<int>(route % map.top_k);
      std::byte* dst = f32 ? reinterpret_cast<std::byte*>(out + route * d)
                           : bytes_of(node_rows) + static_cast<int64_t>(i * rb);
      load_rows(map.rank_of(t, k), buffer, map.row_of(t, k), dst, 1, rb);
    }
    auto* pack = static_cast<std::byte*>(heap_->local(pack_));
    for (const Block& b : step.held) {
      int64_t at = b.offset;
      for (const Run& run : b.runs) {
        load_rows(run.rank, buffer, run.row, pack + at * static_cast<int64_t>(rb), run.rows, rb);
        at += run.rows;
      }
    }
    heap_->quiet();
    heap_->barrier();  // every block is packed at its proxy
    std::vector<Tensor> fetched;
    for (const Block& b : step.sent) {
      fetched.push_back(byte_rows(b.rows, rb));
      load_rows(b.peer, pack_, b.offset, bytes_of(fetched.back()), b.rows, rb);
    }
    heap_->quiet();
    auto place = [&](int64_t route, const std::byte* row) {
      if (f32)
        std::memcpy(out + route * d, row, rb);
      else
        decode_payload_rows(format, row, 1, d, out + route * d);
    };
    if (!f32)
      for (size_t i = 0; i < step.node_routes.size(); ++i)
        place(step.node_routes[i], bytes_of(node_rows) + static_cast<int64_t>(i * rb));
    for (size_t i = 0; i < step.sent.size(); ++i) {
      const Block& b = step.sent[i];
      for (int64_t j = 0; j < b.rows; ++j)
        place(b.routes[static_cast<size_t>(j)], bytes_of(fetched[i]) + j * static_cast<int64_t>(rb));
    }
  }

  Comm& group_;
  PathOptions options_;
  NodeLayout nodes_;
  std::unique_ptr<SymmetricHeap> own_heap_;
  SymmetricHeap* heap_ = nullptr;
  std::shared_ptr<LeasePool> own_pool_;  // without a shared pool (PathOptions::lease_pool)
  int pool_generation_ = 0;
  BufferId pack_ = -1;
  size_t pack_bytes_ = 0;
  int pack_generation_ = 0;
};

}  // namespace

std::unique_ptr<ExpertPath> make_aggregated_path(Comm& ep_group, const PathOptions& options) {
  EXPAR_CHECK(options.placement != nullptr && options.placement->ep_size() == ep_group.size(),
              "path 'aggregated' needs the expert placement of its EP group '{}' ({} ranks)", ep_group.name(),
              ep_group.size());
  return std::make_unique<AggregatedPath>(ep_group, options);
}

}  // namespace expar
