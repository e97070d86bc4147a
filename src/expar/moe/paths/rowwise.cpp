// The `rowwise` path: rowwise EP over symmetric memory (seed 000 §5.4-5.7, Figure 16, Table 8).
//
//   dispatch forward  PUT: each accepted row of x goes straight into its destination rank's SYMMETRIC
//                     dispatch buffer at dst_row (no packed peer buffer, no second permutation, no host
//                     split list); barrier; the experts read the dispatch buffer in place.
//   combine forward   GET: the experts wrote their output into the symmetric combine buffer; each source
//                     gathers its K expert rows per token into [T, K, d] and merges them in k order.
//   combine backward  PUT: w·grad_y rows into the expert-output-gradient rows (the combine buffer again).
//   dispatch backward GET: the route gradients from the expert-input-gradient buffer, summed per token.
//
// Buffers (seed 000 §5.7): the dispatch buffer is saved for backward (the up-projection reads it again for
// Wgrad), so it is LEASED from a LeasePool in dispatch_forward and released at the end of
// dispatch_backward, with check() before every backward read. The expert-output buffer is scratch (only the
// combine transfer reads it), so it is the pool's shared scratch slot kOutputScratch; it also carries the
// expert-output-gradient rows in backward. The expert-input-gradient buffer is a short lease that lives from
// expert backward to the end of dispatch backward.
//
// Activation recomputation (PathState::scratch_dispatch, set by the MoE layer): the dispatch payload goes to
// the second shared scratch slot kDispatchScratch instead of a lease, both in the forward (whose expert
// activations the layer drops) and in the re-dispatch that the layer's backward runs first. A re-dispatched
// payload must survive until its own expert backward, and it does: between this block's re-dispatch and
// the first barrier of its dispatch backward, every rank runs only this block's passes (re-run experts,
// combine forward, combine backward, expert backward), and no rank can start another block's dispatch (the
// only writer of the slot) before every rank has entered that barrier, i.e. finished its expert backward.
// The same barrier argument covers the forward: a peer's next dispatch PUT comes after the combine forward
// barrier, which this rank enters only after its experts read the payload. A caller that skipped the
// recomputation would read a payload another block overwrote; check() in combine backward and before the
// expert backward turns that into an error.
//
// Ordering (all ranks run the same sequence, so every heap barrier matches):
//   dispatch fwd:  PUT rows; barrier                      (every row in place before experts read)
//   combine fwd:   barrier; GET rows                      (every expert wrote its rows before anyone reads)
//   combine bwd:   barrier; PUT rows; barrier             (nobody overwrites an output a peer still reads;
//                                                          every gradient row in place before expert bwd)
//   dispatch bwd:  barrier; GET rows; barrier; release    (peers' expert bwd done; nobody still reads ours)
// Payload precision (PathOptions::precision, seed 000 §5.4/§5.7): a reduced-precision dispatch quantises each
// token row once inside the PUT (encoded into a staging row, then put to each route's slot), and the
// experts read the encoded rows (for MXFP8 the E4M3 qdata followed by the E8M0 scales of the same row) in
// place; both stay in the LEASED dispatch slot until the expert backward has decoded them again for Wgrad.
// A reduced-precision combine has the experts write f32 into a private tensor that combine forward encodes
// into the combine slot before its barrier; the sources GET the encoded rows and decode them. Combine
// backward encodes each w·grad_y row inside its PUT; the expert rank decodes them after the barrier.
// Dispatch backward encodes the expert input gradients into their leased slot before its first barrier.
// Slots hold capacity_rows x the largest encoded row of the four legs (rowwise_slot_bytes).
// With poisoning enabled (debug builds, EXPAR_POISON=1) every symmetric buffer is filled with NaN before the
// rows of a step land in it (one extra barrier where peers write into it), capacity tail included.
#include <algorithm>
#include <cstring>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_precision.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// The pool's shared scratch slots (LeasePool::acquire_scratch).
constexpr int kOutputScratch = 0;    // expert output (forward), expert-output gradient (backward)
constexpr int kDispatchScratch = 1;  // dispatch payload under activation recomputation

// Which routes a pass moves: every valid one, or those of one wave (moe/waves.hpp).
struct RouteFilter {
  const int32_t* wave_of = nullptr;  // [T*K] (null: every route)
  int wave = 0;
  bool take(int64_t route) const { return wave_of == nullptr || wave_of[route] == wave; }
};

// What one step keeps between its passes.
struct RowwiseStep {
  std::shared_ptr<LeasePool> own_pool;  // keeps a replaced own pool alive while its leases are out
  LeasePool* pool = nullptr;
  LeaseTag tag;                // (block, microbatch) of every acquisition of this step
  LeasePool::Handle dispatch;  // [capacity_rows, d] expert input, read again by expert backward: leased, or
                               // scratch kDispatchScratch when the caller recomputes it (scratch_dispatch)
  LeasePool::Handle combine;   // scratch: expert output (forward), expert-output gradient (backward)
  LeasePool::Handle grad_in;   // leased: expert-input gradient, from expert backward to dispatch backward
  bool grad_in_held = false;
  // f32 rows the experts write when their leg travels encoded: encoded into `combine` / `grad_in` by the
  // combine forward / dispatch backward.
  Tensor expert_out;
  Tensor expert_grad_in;
  // Wave passes: where each wave's rows are, the [T, K, d] rows gathered so far (combine forward, then
  // dispatch backward), and the decoded expert-output gradient (a reduced-precision combine backward).
  WaveRoutes waves;
  Tensor gathered;
  Tensor grad_out;

  RowwiseStep() = default;
  RowwiseStep(const RowwiseStep&) = delete;
  RowwiseStep& operator=(const RowwiseStep&) = delete;
  // A step that never ran its backward (inference, or a forward whose backward was skipped) gives its
  // leases back when its state is dropped, so forward-only use does not grow the pool. Safe without a
  // barrier: only this rank's experts read its dispatch slot, and they are done with it.
  ~RowwiseStep() {
    if (pool == nullptr) return;
    if (dispatch.leased) pool->release(dispatch);
    if (grad_in.leased) pool->release(grad_in);
  }
};

class RowwisePath final : public ExpertPath {
 public:
  RowwisePath(Comm& ep_group, const PathOptions& options)
      : group_(ep_group), options_(options), heap_(&path_heap("rowwise", ep_group, options, own_heap_)) {}

  std::string name() const override { return "rowwise"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    Tensor in = start_dispatch(x, map, state);
    put_dispatch_rows(x, map, step_of(state, "dispatch forward"), {});
    return in;
  }

  Tensor dispatch_forward_begin(const Tensor& x, const RouteMap& map, PathState& state) override {
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    Tensor in = start_dispatch(x, map, state);
    RowwiseStep& step = step_of(state, "dispatch forward");
    step.waves = make_wave_routes(map, *options_.placement, state.waves);
    return in;
  }

  void dispatch_forward_wave(const Tensor& x, const RouteMap& map, PathState& state, int wave) override {
    RowwiseStep& step = step_of(state, "dispatch forward");
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    put_dispatch_rows(x, map, step, filter_of(step, wave));
  }

 private:
  // Dispatch forward's set-up: the step, its dispatch slot (leased, or scratch), the poison.
  Tensor start_dispatch(const Tensor& x, const RouteMap& map, PathState& state) {
    check_dispatch_input("rowwise", group_, map, x);
    const int64_t d = x.dim(1);
    auto step = std::make_shared<RowwiseStep>();
    step->tag = {options_.block_index, state.microbatch};
    step->pool = pool_for(map.capacity_rows, d, *step);
    step->dispatch = state.scratch_dispatch ? step->pool->acquire_scratch(step->tag, kDispatchScratch)
                                            : step->pool->acquire(step->tag);
    state.path_data = step;
    poison_then_barrier(step->dispatch.buffer, map.capacity_rows, d);
    return borrow_payload(step->pool->data(step->dispatch), options_.precision.dispatch, map.capacity_rows,
                          d);
  }

  // PUT of the accepted rows of x that `filter` takes into their destinations' dispatch slots (a reduced
  // precision row encoded once per token and pass), then the barrier after which they are in place.
  void put_dispatch_rows(const Tensor& x, const RouteMap& map, RowwiseStep& step, RouteFilter filter) {
    const int64_t d = x.dim(1);
    const BufferId buffer = step.dispatch.buffer;
    const PayloadFormat format = options_.precision.dispatch;
    const size_t rb = payload_row_bytes(format, d);
    const float* src = x.data<float>();
    // A put's source stays untouched until the barrier completes it (MPI_Put to another node may still be
    // reading it), so each token's encoded row has its own place.
    std::vector<std::byte> encoded(format == PayloadFormat::F32 ? 0 : static_cast<size_t>(map.tokens) * rb);
    for (int64_t t = 0; t < map.tokens; ++t) {
      const std::byte* row = reinterpret_cast<const std::byte*>(src + t * d);
      bool encoded_row = false;
      for (int k = 0; k < map.top_k; ++k) {
        if (!map.valid(t, k) || !filter.take(t * map.top_k + k)) continue;
        if (format != PayloadFormat::F32 && !encoded_row) {
          std::byte* mine = encoded.data() + static_cast<size_t>(t) * rb;
          encode_payload_rows(format, src + t * d, 1, d, mine);
          row = mine;
          encoded_row = true;
        }
        put_bytes(map.rank_of(t, k), buffer, static_cast<size_t>(map.row_of(t, k)) * rb, row, rb);
      }
    }
    heap_->barrier();
  }

  static RouteFilter filter_of(const RowwiseStep& step, int wave) {
    EXPAR_ASSERT(wave >= 0 && wave < step.waves.waves,
                 "rowwise path: wave {} of a step planned with {} waves", wave, step.waves.waves);
    return {step.waves.wave_of.data(), wave};
  }

 public:
  Tensor expert_output_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    RowwiseStep& step = step_of(state, "expert_output_buffer");
    step.combine = step.pool->acquire_scratch(step.tag, kOutputScratch);
    // Only this rank writes here in forward, and every peer finished reading the previous contents before
    // it entered this step's dispatch barrier: no barrier needed after the poison.
    if (poison_enabled()) fill_nan(step.pool->data(step.combine), step.pool->slot_bytes());
    if (options_.precision.combine != PayloadFormat::F32) {
      step.expert_out = Tensor::empty({map.capacity_rows, d});
      return step.expert_out;
    }
    return Tensor::borrow(step.pool->data(step.combine), {map.capacity_rows, d}, DType::F32);
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    RowwiseStep& step = step_of(state, "combine forward");
    const int64_t d = expert_out.dim(1);
    const PayloadFormat format = options_.precision.combine;
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    if (format != PayloadFormat::F32)
      encode_staged(expert_out, step.expert_out, step.pool->data(step.combine), format, map.recv_rows,
                    "combine forward", "expert_output_buffer()");
    heap_->barrier();
    step.pool->check(step.combine);
    Tensor gathered;
    gather_routes(step.combine.buffer, map, d, format, {}, gathered);
    state.combine_rows = RouteRows::gathered(std::move(gathered), map);
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  void combine_forward_wave(const Tensor& expert_out, const RouteMap& map, PathState& state,
                            int wave) override {
    RowwiseStep& step = step_of(state, "combine forward");
    const RouteFilter filter = filter_of(step, wave);
    const int64_t d = expert_out.dim(1);
    const PayloadFormat format = options_.precision.combine;
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    if (format != PayloadFormat::F32)
      encode_wave(expert_out, step.expert_out, step.pool->data(step.combine), format, step.waves, map.ep_rank,
                  wave, "combine forward", "expert_output_buffer()");
    heap_->barrier();  // every expert rank wrote (and encoded) this wave's rows
    step.pool->check(step.combine);
    gather_routes(step.combine.buffer, map, d, format, filter, step.gathered);
  }

  Tensor combine_forward_end(const Tensor& topk_weight, const RouteMap& map, PathState& state) override {
    RowwiseStep& step = step_of(state, "combine forward");
    EXPAR_ASSERT(step.gathered.defined(), "rowwise combine_forward_end before any combine_forward_wave");
    PhaseScope combine_phase(phase::kRowGatherReduce);
    step.expert_out = Tensor();
    state.combine_rows = RouteRows::gathered(std::move(step.gathered), map);
    step.gathered = Tensor();
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    RowwiseStep& step = start_combine_backward(grad_y, map, state, grad_topk_weight);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    put_route_grads(grad_y, topk_weight, map, step, {});
    const int64_t d = grad_y.dim(1);
    const PayloadFormat format = options_.precision.combine_grad;
    // The expert backward reads f32 rows: decoded from the encoded ones that arrived.
    return decode_payload(borrow_payload(step.pool->data(step.combine), format, map.capacity_rows, d), format,
                          format == PayloadFormat::F32 ? map.capacity_rows : map.recv_rows, d);
  }

  Tensor combine_backward_begin(const Tensor& grad_y, const Tensor& /*topk_weight*/, const RouteMap& map,
                                PathState& state, Tensor& grad_topk_weight) override {
    RowwiseStep& step = start_combine_backward(grad_y, map, state, grad_topk_weight);
    const int64_t d = grad_y.dim(1);
    if (options_.precision.combine_grad == PayloadFormat::F32)
      return Tensor::borrow(step.pool->data(step.combine), {map.capacity_rows, d}, DType::F32);
    // Each wave's rows are decoded here as they arrive.
    step.grad_out = Tensor::empty({map.capacity_rows, d});
    return step.grad_out;
  }

  void combine_backward_wave(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                             PathState& state, int wave) override {
    RowwiseStep& step = step_of(state, "combine backward");
    const RouteFilter filter = filter_of(step, wave);
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    put_route_grads(grad_y, topk_weight, map, step, filter);
    const PayloadFormat format = options_.precision.combine_grad;
    if (format == PayloadFormat::F32) return;
    const int64_t d = grad_y.dim(1), begin = step.waves.row_begin(map.ep_rank, wave);
    const int64_t end = step.waves.row_end(map.ep_rank, wave);
    const size_t rb = payload_row_bytes(format, d);
    decode_rows(format, static_cast<const std::byte*>(step.pool->data(step.combine)) + begin * rb,
                end - begin, d, step.grad_out.data<float>() + begin * d);
  }

  Tensor expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    RowwiseStep& step = step_of(state, "expert_grad_input_buffer");
    // The expert backward about to run reads the saved dispatch payload for Wgrad.
    step.pool->check(step.dispatch);
    step.grad_in = step.pool->acquire(step.tag);
    step.grad_in_held = true;
    // A fresh lease: every peer's last access to this slot ended before a barrier we all passed.
    if (poison_enabled()) fill_nan(step.pool->data(step.grad_in), step.pool->slot_bytes());
    if (options_.precision.dispatch_grad != PayloadFormat::F32) {
      step.expert_grad_in = Tensor::empty({map.capacity_rows, d});
      return step.expert_grad_in;
    }
    return Tensor::borrow(step.pool->data(step.grad_in), {map.capacity_rows, d}, DType::F32);
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    RowwiseStep& step = step_of(state, "dispatch backward");
    check_grad_in(step);
    const int64_t d = grad_expert_in.dim(1);
    const PayloadFormat format = options_.precision.dispatch_grad;
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    if (format != PayloadFormat::F32)
      encode_staged(grad_expert_in, step.expert_grad_in, step.pool->data(step.grad_in), format, map.recv_rows,
                    "dispatch backward", "expert_grad_input_buffer()");
    heap_->barrier();  // every peer's expert backward wrote (and encoded) its rows
    step.pool->check(step.grad_in);
    // With every peer's f32 buffer mapped here, the route gradients are summed where they lie (no [T, K, d]
    // gather: one read of each row instead of a read, a write and a read); otherwise they are gathered
    // (and decoded). Either way every read ends before the barrier below, after which peers may reuse their
    // buffers.
    std::vector<const float*> direct =
        format == PayloadFormat::F32 ? mapped_rows(step.grad_in.buffer, map, d) : std::vector<const float*>{};
    Tensor grad_x = direct.empty() ? Tensor() : sum_route_pointers(direct.data(), map, d);
    Tensor gathered;
    if (direct.empty()) gather_routes(step.grad_in.buffer, map, d, format, {}, gathered);
    finish_dispatch_backward(step);
    if (!direct.empty()) return grad_x;
    return sum_routes(RouteRows::gathered(std::move(gathered), map), map);
  }

  // A wave's route gradients are gathered to [T, K, d] as they become ready (the sum over k needs every
  // wave's rows, so it waits for dispatch_backward_end).
  void dispatch_backward_wave(const Tensor& grad_expert_in, const RouteMap& map, PathState& state,
                              int wave) override {
    RowwiseStep& step = step_of(state, "dispatch backward");
    check_grad_in(step);
    const RouteFilter filter = filter_of(step, wave);
    const int64_t d = grad_expert_in.dim(1);
    const PayloadFormat format = options_.precision.dispatch_grad;
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    if (format != PayloadFormat::F32)
      encode_wave(grad_expert_in, step.expert_grad_in, step.pool->data(step.grad_in), format, step.waves,
                  map.ep_rank, wave, "dispatch backward", "expert_grad_input_buffer()");
    heap_->barrier();  // every peer's expert backward of this wave wrote (and encoded) its rows
    step.pool->check(step.grad_in);
    gather_routes(step.grad_in.buffer, map, d, format, filter, step.gathered);
  }

  Tensor dispatch_backward_end(const RouteMap& map, PathState& state) override {
    RowwiseStep& step = step_of(state, "dispatch backward");
    check_grad_in(step);
    EXPAR_ASSERT(step.gathered.defined(), "rowwise dispatch_backward_end before any dispatch_backward_wave");
    PhaseScope dispatch_phase(phase::kRowDispatch);
    finish_dispatch_backward(step);
    step.expert_grad_in = Tensor();
    Tensor gathered = std::move(step.gathered);
    step.gathered = Tensor();
    return sum_routes(RouteRows::gathered(std::move(gathered), map), map);
  }

 private:
  // Combine backward's set-up: the routing-weight gradient, then (once every peer finished gathering the
  // expert outputs from the combine slot) the slot again, poisoned, for the w·grad_y rows.
  RowwiseStep& start_combine_backward(const Tensor& grad_y, const RouteMap& map, PathState& state,
                                      Tensor& grad_topk_weight) {
    RowwiseStep& step = step_of(state, "combine backward");
    EXPAR_ASSERT(state.combine_rows.defined(), "rowwise combine backward called before combine forward");
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    step.pool->check(step.dispatch);
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    heap_->barrier();  // every peer finished gathering expert outputs from the combine buffer
    step.combine = step.pool->acquire_scratch(step.tag, kOutputScratch);
    poison_then_barrier(step.combine.buffer, map.capacity_rows, grad_y.dim(1));
    return step;
  }

  // PUT of the w·grad_y rows of the routes `filter` takes into the expert-output-gradient rows, then the
  // barrier after which they are in place. A peer whose buffer is mapped here gets its row written in
  // place (one pass instead of a staging row and a copy; encoded straight into it for a reduced precision);
  // others get the staged row by put.
  void put_route_grads(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                       RowwiseStep& step, RouteFilter filter) {
    const BufferId buffer = step.combine.buffer;
    const int64_t d = grad_y.dim(1);
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    const PayloadFormat format = options_.precision.combine_grad;
    const size_t rb = payload_row_bytes(format, d);
    std::vector<float> row(static_cast<size_t>(d));
    // Rows put to an unmapped peer are staged each in its own place (route t·K + k), untouched until the
    // barrier completes the put (MPI_Put to another node may still be reading them).
    std::vector<std::byte> staging;
    auto staged = [&](int64_t t, int k) {
      if (staging.empty()) staging.resize(static_cast<size_t>(map.tokens * map.top_k) * rb);
      return staging.data() + static_cast<size_t>(t * map.top_k + k) * rb;
    };
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k) && filter.take(t * map.top_k + k)) {
          const int peer = map.rank_of(t, k);
          const float wk = w[t * map.top_k + k];
          const size_t offset = static_cast<size_t>(map.row_of(t, k)) * rb;
          void* base = heap_->peer_ptr(peer, buffer);
          if (format == PayloadFormat::F32 && base != nullptr) {
            weighted_route_grad(gy + t * d, wk,
                                reinterpret_cast<float*>(static_cast<std::byte*>(base) + offset), d);
            continue;
          }
          if (format == PayloadFormat::F32) {
            std::byte* out = staged(t, k);
            weighted_route_grad(gy + t * d, wk, reinterpret_cast<float*>(out), d);
            put_bytes(peer, buffer, offset, out, rb);
            continue;
          }
          weighted_route_grad(gy + t * d, wk, row.data(), d);
          if (base != nullptr) {
            encode_payload_rows(format, row.data(), 1, d, static_cast<std::byte*>(base) + offset);
          } else {
            std::byte* out = staged(t, k);
            encode_payload_rows(format, row.data(), 1, d, out);
            put_bytes(peer, buffer, offset, out, rb);
          }
        }
    heap_->barrier();
  }

  static void check_grad_in(const RowwiseStep& step) {
    EXPAR_ASSERT(step.grad_in_held,
                 "rowwise dispatch backward: the expert input gradient must be written into "
                 "expert_grad_input_buffer() (peers GET the route gradients from it)");
  }

  // Dispatch backward's end: once nobody reads our gradient or dispatch rows any more, both slots go back.
  void finish_dispatch_backward(RowwiseStep& step) {
    heap_->barrier();
    step.pool->release(step.grad_in);
    step.grad_in_held = false;
    if (step.dispatch.leased) step.pool->release(step.dispatch);  // a scratch payload holds no lease
  }

  // encode_staged for one wave: this rank's expert-side rows of `wave` only (the staging tensor stays for
  // the other waves).
  static void encode_wave(const Tensor& written, const Tensor& staged, void* slot, PayloadFormat format,
                          const WaveRoutes& waves, int rank, int wave, const char* pass, const char* hook) {
    EXPAR_ASSERT(written.raw() == staged.raw(),
                 "rowwise {}: with a {} payload the experts must write into {} (it is encoded from there)",
                 pass, payload_format_name(format), hook);
    const int64_t d = written.dim(1), begin = waves.row_begin(rank, wave), end = waves.row_end(rank, wave);
    encode_rows(format, written.data<float>() + begin * d, end - begin, d,
                static_cast<std::byte*>(slot) + begin * static_cast<int64_t>(payload_row_bytes(format, d)));
  }

  // A leg that travels encoded: the experts wrote f32 rows [0, rows) into `staged` (the tensor the buffer
  // hook handed out); they are encoded into the symmetric slot at `slot`, and the staging tensor is dropped.
  static void encode_staged(const Tensor& written, Tensor& staged, void* slot, PayloadFormat format,
                            int64_t rows, const char* pass, const char* hook) {
    EXPAR_ASSERT(written.raw() == staged.raw(),
                 "rowwise {}: with a {} payload the experts must write into {} (it is encoded from there)",
                 pass, payload_format_name(format), hook);
    encode_rows(format, written.data<float>(), rows, written.dim(1), static_cast<std::byte*>(slot));
    staged = Tensor();
  }

  static RowwiseStep& step_of(PathState& state, const char* pass) {
    EXPAR_ASSERT(state.path_data != nullptr, "rowwise {} called before dispatch forward of the same step",
                 pass);
    return *static_cast<RowwiseStep*>(state.path_data.get());
  }

  // The pool whose slots hold [capacity_rows, d] f32. capacity_rows is identical on every rank of the group
  // (route map), so every rank makes the same decision and any growth is a matching collective allocation.
  LeasePool* pool_for(int64_t capacity_rows, int64_t d, RowwiseStep& step) {
    LeasePool& pool =
        step_lease_pool("rowwise", options_, *heap_, capacity_rows, d, own_pool_, pool_generation_);
    if (&pool != options_.lease_pool) step.own_pool = own_pool_;
    return &pool;
  }

  // Poisons this rank's copy of `buffer` and waits until every member did, so that no peer's rows land
  // before the poison does.
  void poison_then_barrier(BufferId buffer, int64_t capacity_rows, int64_t d) {
    if (!poison_enabled()) return;
    fill_nan(heap_->local(buffer), heap_->bytes(buffer));
    heap_->barrier();
  }

  void put_bytes(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) {
    if (void* base = heap_->peer_ptr(peer, buffer))
      std::memcpy(static_cast<std::byte*>(base) + offset, src, bytes);
    else
      heap_->put(peer, buffer, offset, src, bytes);
  }

  // [T*K]: where each valid route's row lies in its expert rank's `buffer` (null for the others), or empty
  // when some peer's buffer is not mapped here (or there are no routes).
  std::vector<const float*> mapped_rows(BufferId buffer, const RouteMap& map, int64_t d) {
    std::vector<const float*> base(static_cast<size_t>(group_.size()));
    for (int p = 0; p < group_.size(); ++p) {
      base[static_cast<size_t>(p)] = static_cast<const float*>(heap_->peer_ptr(p, buffer));
      if (base[static_cast<size_t>(p)] == nullptr) return {};
    }
    std::vector<const float*> rows(static_cast<size_t>(map.tokens * map.top_k), nullptr);
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k))
          rows[static_cast<size_t>(t * map.top_k + k)] =
              base[static_cast<size_t>(map.rank_of(t, k))] + static_cast<int64_t>(map.row_of(t, k)) * d;
    return rows;
  }

  // [T, K, d]: the row of every valid route, from its expert rank's `buffer` at dst_row, where it lies
  // encoded in `format` (decoded on arrival: straight from a mapped peer's memory, or after quiet() from
  // the staged bytes a get brought).
  // Only the routes `filter` takes, into `gathered` (allocated when undefined; other rows left as they are).
  void gather_routes(BufferId buffer, const RouteMap& map, int64_t d, PayloadFormat format,
                     RouteFilter filter, Tensor& gathered) {
    if (!gathered.defined()) gathered = Tensor::empty({map.tokens, map.top_k, d});
    float* out = gathered.data<float>();
    const size_t rb = payload_row_bytes(format, d);
    const bool f32 = format == PayloadFormat::F32;
    struct Remote {
      int64_t route;
      int peer;
      size_t offset;
    };
    std::vector<Remote> remote;
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k) {
        if (!map.valid(t, k) || !filter.take(t * map.top_k + k)) continue;
        const int peer = map.rank_of(t, k);
        const size_t offset = static_cast<size_t>(map.row_of(t, k)) * rb;
        float* dst = out + (t * map.top_k + k) * d;
        if (const void* base = heap_->peer_ptr(peer, buffer)) {
          const std::byte* row = static_cast<const std::byte*>(base) + offset;
          if (f32)
            std::memcpy(dst, row, rb);  // the hot f32 case without the codec's per-call checks
          else
            decode_payload_rows(format, row, 1, d, dst);
        } else if (f32) {
          heap_->get(peer, buffer, offset, dst, rb);
          remote.push_back({-1, peer, offset});
        } else {
          remote.push_back({t * map.top_k + k, peer, offset});
        }
      }
    if (remote.empty()) return;
    if (f32) {
      heap_->quiet();
      return;
    }
    std::vector<std::byte> staged(remote.size() * rb);
    for (size_t i = 0; i < remote.size(); ++i)
      heap_->get(remote[i].peer, buffer, remote[i].offset, staged.data() + i * rb, rb);
    heap_->quiet();
    for (size_t i = 0; i < remote.size(); ++i)
      decode_payload_rows(format, staged.data() + i * rb, 1, d, out + remote[i].route * d);
  }

  Comm& group_;
  PathOptions options_;
  std::unique_ptr<SymmetricHeap> own_heap_;
  SymmetricHeap* heap_ = nullptr;
  std::shared_ptr<LeasePool> own_pool_;
  int pool_generation_ = 0;
};

}  // namespace

size_t rowwise_slot_bytes(int64_t capacity_rows, int64_t d, const PayloadPrecision& precision) {
  return static_cast<size_t>(std::max<int64_t>(0, capacity_rows)) * precision.max_row_bytes(d);
}

std::unique_ptr<ExpertPath> make_rowwise_path(Comm& ep_group, const PathOptions& options) {
  return std::make_unique<RowwisePath>(ep_group, options);
}

}  // namespace expar
