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
// With poisoning enabled (debug builds, EXPAR_POISON=1) every symmetric buffer is filled with NaN before the
// rows of a step land in it (one extra barrier where peers write into it), capacity tail included.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/lease_pool.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

// The pool's shared scratch slots (LeasePool::acquire_scratch).
constexpr int kOutputScratch = 0;    // expert output (forward), expert-output gradient (backward)
constexpr int kDispatchScratch = 1;  // dispatch payload under activation recomputation

// What one step keeps between its passes.
struct RowwiseStep {
  std::shared_ptr<LeasePool> own_pool;  // keeps a replaced own pool alive while its leases are out
  LeasePool* pool = nullptr;
  LeasePool::Handle dispatch;  // [capacity_rows, d] expert input, read again by expert backward: leased, or
                               // scratch kDispatchScratch when the caller recomputes it (scratch_dispatch)
  LeasePool::Handle combine;   // scratch: expert output (forward), expert-output gradient (backward)
  LeasePool::Handle grad_in;   // leased: expert-input gradient, from expert backward to dispatch backward
  bool grad_in_held = false;

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
  RowwisePath(Comm& ep_group, const PathOptions& options) : group_(ep_group), options_(options) {
    if (options_.heap != nullptr) {
      heap_ = options_.heap;
    } else {
      own_heap_ = ep_group.make_heap();
      heap_ = own_heap_.get();
    }
    EXPAR_CHECK(
        heap_->size() == ep_group.size() && heap_->rank() == ep_group.rank(),
        "rowwise path: the shared symmetric heap has rank {} of {} but EP group '{}' has rank {} of {}: "
        "pass a heap made by this EP group's make_heap()",
        heap_->rank(), heap_->size(), ep_group.name(), ep_group.rank(), ep_group.size());
  }

  std::string name() const override { return "rowwise"; }

  Tensor dispatch_forward(const Tensor& x, const RouteMap& map, PathState& state) override {
    EXPAR_CHECK(map.ep_size == group_.size() && map.ep_rank == group_.rank(),
                "rowwise dispatch: the route map is for EP rank {} of {} but the path's group '{}' has rank "
                "{} of {}",
                map.ep_rank, map.ep_size, group_.name(), group_.rank(), group_.size());
    EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(0) == map.tokens,
                "rowwise dispatch: x must be f32 [{}, d], got {} {}", map.tokens, dtype_name(x.dtype()),
                shape_string(x.shape()));
    const int64_t d = x.dim(1);
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    auto step = std::make_shared<RowwiseStep>();
    step->pool = pool_for(map.capacity_rows, d, *step);
    step->dispatch = state.scratch_dispatch ? step->pool->acquire_scratch(tag(), kDispatchScratch)
                                            : step->pool->acquire(tag());
    state.path_data = step;
    const BufferId buffer = step->dispatch.buffer;
    poison_then_barrier(buffer, map.capacity_rows, d);
    const float* src = x.data<float>();
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k)) put_row(map.rank_of(t, k), buffer, map.row_of(t, k), src + t * d, d);
    heap_->barrier();
    return Tensor::borrow(step->pool->data(step->dispatch), {map.capacity_rows, d}, DType::F32);
  }

  Tensor expert_output_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    RowwiseStep& step = step_of(state, "expert_output_buffer");
    step.combine = step.pool->acquire_scratch(tag(), kOutputScratch);
    // Only this rank's experts write here in forward, and every peer finished reading the previous
    // contents before it entered this step's dispatch barrier: no barrier needed after the poison.
    if (poison_enabled()) fill_nan(step.pool->data(step.combine), step.pool->slot_bytes());
    return Tensor::borrow(step.pool->data(step.combine), {map.capacity_rows, d}, DType::F32);
  }

  Tensor combine_forward(const Tensor& expert_out, const Tensor& topk_weight, const RouteMap& map,
                         PathState& state) override {
    RowwiseStep& step = step_of(state, "combine forward");
    const int64_t d = expert_out.dim(1);
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    heap_->barrier();
    step.pool->check(step.combine);
    state.combine_rows = RouteRows::gathered(gather_routes(step.combine.buffer, map, d), map);
    return merge_routes(state.combine_rows, topk_weight, map);
  }

  Tensor combine_backward(const Tensor& grad_y, const Tensor& topk_weight, const RouteMap& map,
                          PathState& state, Tensor& grad_topk_weight) override {
    RowwiseStep& step = step_of(state, "combine backward");
    EXPAR_CHECK(state.combine_rows.defined(), "rowwise combine backward called before combine forward");
    sync_before_comm(group_);
    PhaseScope combine_phase(phase::kRowGatherReduce);
    step.pool->check(step.dispatch);
    grad_topk_weight = route_weight_grads(grad_y, state.combine_rows, map);
    const int64_t d = grad_y.dim(1);
    heap_->barrier();  // every peer finished gathering expert outputs from the combine buffer
    step.combine = step.pool->acquire_scratch(tag(), kOutputScratch);
    const BufferId buffer = step.combine.buffer;
    poison_then_barrier(buffer, map.capacity_rows, d);
    const float* gy = grad_y.data<float>();
    const float* w = topk_weight.data<float>();
    // A peer whose buffer is mapped here gets its w·grad_y row written in place (one pass instead of a
    // staging row and a copy); others get the staged row by put.
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k)
        if (map.valid(t, k)) {
          const int peer = map.rank_of(t, k);
          const float wk = w[t * map.top_k + k];
          if (void* base = heap_->peer_ptr(peer, buffer)) {
            weighted_route_grad(gy + t * d, wk, static_cast<float*>(base) + map.row_of(t, k) * d, d);
          } else {
            weighted_route_grad(gy + t * d, wk, row.data(), d);
            put_row(peer, buffer, map.row_of(t, k), row.data(), d);
          }
        }
    heap_->barrier();
    return Tensor::borrow(step.pool->data(step.combine), {map.capacity_rows, d}, DType::F32);
  }

  Tensor expert_grad_input_buffer(const RouteMap& map, int64_t d, PathState& state) override {
    RowwiseStep& step = step_of(state, "expert_grad_input_buffer");
    // The expert backward about to run reads the saved dispatch payload for Wgrad.
    step.pool->check(step.dispatch);
    step.grad_in = step.pool->acquire(tag());
    step.grad_in_held = true;
    // A fresh lease: every peer's last access to this slot ended before a barrier we all passed.
    if (poison_enabled()) fill_nan(step.pool->data(step.grad_in), step.pool->slot_bytes());
    return Tensor::borrow(step.pool->data(step.grad_in), {map.capacity_rows, d}, DType::F32);
  }

  Tensor dispatch_backward(const Tensor& grad_expert_in, const RouteMap& map, PathState& state) override {
    RowwiseStep& step = step_of(state, "dispatch backward");
    EXPAR_CHECK(step.grad_in_held,
                "rowwise dispatch backward: the expert input gradient must be written into "
                "expert_grad_input_buffer() (peers GET the route gradients from it)");
    const int64_t d = grad_expert_in.dim(1);
    sync_before_comm(group_);
    PhaseScope dispatch_phase(phase::kRowDispatch);
    heap_->barrier();  // every peer's expert backward wrote its rows
    step.pool->check(step.grad_in);
    // With every peer's buffer mapped here, the route gradients are summed where they lie (no [T, K, d]
    // gather: one read of each row instead of a read, a write and a read); otherwise they are gathered.
    // Either way every read ends before the barrier below, after which peers may reuse their buffers.
    std::vector<const float*> direct = mapped_rows(step.grad_in.buffer, map, d);
    Tensor grad_x = direct.empty() ? Tensor() : sum_route_pointers(direct.data(), map, d);
    Tensor gathered = direct.empty() ? gather_routes(step.grad_in.buffer, map, d) : Tensor();
    heap_->barrier();  // nobody reads our gradient or dispatch rows any more
    step.pool->release(step.grad_in);
    step.grad_in_held = false;
    if (step.dispatch.leased) step.pool->release(step.dispatch);  // a scratch payload holds no lease
    if (!direct.empty()) return grad_x;
    return sum_routes(RouteRows::gathered(std::move(gathered), map), map);
  }

 private:
  LeaseTag tag() const { return {options_.block_index, -1}; }

  static RowwiseStep& step_of(PathState& state, const char* pass) {
    EXPAR_CHECK(state.path_data != nullptr, "rowwise {} called before dispatch forward of the same step",
                pass);
    return *static_cast<RowwiseStep*>(state.path_data.get());
  }

  // The pool whose slots hold [capacity_rows, d] f32. capacity_rows is identical on every rank of the group
  // (route map), so every rank makes the same decision and any growth is a matching collective allocation.
  LeasePool* pool_for(int64_t capacity_rows, int64_t d, RowwiseStep& step) {
    const size_t needed = static_cast<size_t>(capacity_rows * d) * sizeof(float);
    if (options_.lease_pool != nullptr) {
      EXPAR_CHECK(
          options_.lease_pool->slot_bytes() >= needed,
          "rowwise path: capacity_rows={} x d={} needs {} bytes per symmetric slot but the shared lease "
          "pool has slots of {} bytes: make the pool with slot_bytes >= {} (the capacity is the "
          "dropless bound sum_s T_s*min(K, E_L) or the capacity policy's, identical on every rank)",
          capacity_rows, d, needed, options_.lease_pool->slot_bytes(), needed);
      return options_.lease_pool;
    }
    if (!own_pool_ || own_pool_->slot_bytes() < needed) {
      // Rounded up to a power of two of rows so that a slowly growing capacity reallocates rarely; a replaced
      // pool stays alive (its symmetric memory stays resident) while earlier steps still hold its leases.
      const int64_t rows =
          static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(1, capacity_rows))));
      own_pool_ = std::make_shared<LeasePool>(
          *heap_, fmt::format("rowwise{}.gen{}", options_.block_index, pool_generation_++),
          static_cast<size_t>(rows * d) * sizeof(float));
    }
    step.own_pool = own_pool_;
    return own_pool_.get();
  }

  // Poisons this rank's copy of `buffer` and waits until every member did, so that no peer's rows land
  // before the poison does.
  void poison_then_barrier(BufferId buffer, int64_t capacity_rows, int64_t d) {
    if (!poison_enabled()) return;
    fill_nan(heap_->local(buffer), heap_->bytes(buffer));
    heap_->barrier();
  }

  void put_row(int peer, BufferId buffer, int64_t row, const float* src, int64_t d) {
    const size_t bytes = sizeof(float) * static_cast<size_t>(d);
    if (void* base = heap_->peer_ptr(peer, buffer))
      std::memcpy(static_cast<std::byte*>(base) + static_cast<size_t>(row) * bytes, src, bytes);
    else
      heap_->put(peer, buffer, static_cast<size_t>(row) * bytes, src, bytes);
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

  // [T, K, d]: the row of every valid route, from its expert rank's `buffer` at dst_row.
  Tensor gather_routes(BufferId buffer, const RouteMap& map, int64_t d) {
    Tensor gathered = Tensor::empty({map.tokens, map.top_k, d});
    float* out = gathered.data<float>();
    const size_t bytes = sizeof(float) * static_cast<size_t>(d);
    bool pending = false;
    for (int64_t t = 0; t < map.tokens; ++t)
      for (int k = 0; k < map.top_k; ++k) {
        if (!map.valid(t, k)) continue;
        const int peer = map.rank_of(t, k);
        const size_t offset = static_cast<size_t>(map.row_of(t, k)) * bytes;
        float* dst = out + (t * map.top_k + k) * d;
        if (const void* base = heap_->peer_ptr(peer, buffer)) {
          std::memcpy(dst, static_cast<const std::byte*>(base) + offset, bytes);
        } else {
          heap_->get(peer, buffer, offset, dst, bytes);
          pending = true;
        }
      }
    if (pending) heap_->quiet();
    return gathered;
  }

  Comm& group_;
  PathOptions options_;
  std::unique_ptr<SymmetricHeap> own_heap_;
  SymmetricHeap* heap_ = nullptr;
  std::shared_ptr<LeasePool> own_pool_;
  int pool_generation_ = 0;
};

}  // namespace

std::unique_ptr<ExpertPath> make_rowwise_path(Comm& ep_group, const PathOptions& options) {
  return std::make_unique<RowwisePath>(ep_group, options);
}

}  // namespace expar
