#include "expar/comm/mpi/mpi_heap.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>

#include "expar/comm/mpi/mpi_util.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar::mpi {

namespace {

// What each member asks for in one allocate(), exchanged so that every member can compare all requests.
struct Request {
  uint64_t bytes;
  uint64_t name_hash;
  uint32_t name_length;
  char name[116];
};

Request request_of(const std::string& name, size_t bytes) {
  Request r{};
  r.bytes = bytes;
  r.name_hash = std::hash<std::string>{}(name);
  r.name_length = static_cast<uint32_t>(name.size());
  std::memcpy(r.name, name.data(), std::min(name.size(), sizeof(r.name) - 1));
  return r;
}

bool same(const Request& a, const Request& b) {
  return a.bytes == b.bytes && a.name_hash == b.name_hash && a.name_length == b.name_length &&
         std::strncmp(a.name, b.name, sizeof(a.name)) == 0;
}

uint64_t* slot_at(std::byte* base, int slot) {
  return reinterpret_cast<uint64_t*>(base) + slot;
}

}  // namespace

MpiHeap::MpiHeap(MPI_Comm comm, std::string name, double timeout_seconds, HeapMode mode, NodeMap nodes)
    : name_(std::move(name)), timeout_seconds_(timeout_seconds), mode_(mode) {
  nodes_ = std::move(nodes);
  BlockingDeadline deadline("symmetric heap creation", name_, timeout_seconds_);
  check(MPI_Comm_dup(comm, &group_), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(group_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(group_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(group_, &size_), "MPI_Comm_size");
  node_rank_.assign(static_cast<size_t>(size_), MPI_UNDEFINED);
  if (mode_ == HeapMode::Auto) {
    check(MPI_Comm_split_type(group_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_),
          "MPI_Comm_split_type");
    MPI_Group g, n;
    check(MPI_Comm_group(group_, &g), "MPI_Comm_group");
    check(MPI_Comm_group(node_, &n), "MPI_Comm_group");
    std::vector<int> ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = r;
    check(MPI_Group_translate_ranks(g, size_, ranks.data(), n, node_rank_.data()),
          "MPI_Group_translate_ranks");
    MPI_Group_free(&g);
    MPI_Group_free(&n);
    int node_size = 0;
    MPI_Comm_size(node_, &node_size);
    spans_nodes_ = node_size < size_;
  } else {
    spans_nodes_ = true;
  }
  signals_ = create_window(kSignalSlots * sizeof(uint64_t));
  barrier();
}

MpiHeap::~MpiHeap() {
  for (auto& b : buffers_) b.tracker->sub(b.category, static_cast<int64_t>(b.bytes));
  // MPI_Win_free is collective: while an error unwinds, peers may never arrive, so the windows are left to
  // MPI_Abort (run_mpi) instead of waiting for them.
  if (!active() || unwinding()) return;
  BlockingDeadline deadline("symmetric heap destruction (MPI_Win_free)", name_, timeout_seconds_);
  for (auto& b : buffers_) free_window(b.window);
  free_window(signals_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  MPI_Comm_free(&group_);
}

MpiHeap::Window MpiHeap::create_window(size_t bytes) {
  BlockingDeadline deadline("window creation", name_, timeout_seconds_);
  Window w;
  w.peers.assign(static_cast<size_t>(size_), nullptr);
  // A one-byte minimum keeps every member's base pointer valid for zero-byte buffers.
  const auto size = static_cast<MPI_Aint>(std::max<size_t>(bytes, 1));
  void* base = nullptr;
  if (mode_ == HeapMode::Auto) {
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    int rc = MPI_Win_allocate_shared(size, 1, info, node_, &base, &w.shm);
    MPI_Info_free(&info);
    check(rc, "MPI_Win_allocate_shared");
    MPI_Win_set_errhandler(w.shm, MPI_ERRORS_RETURN);
    for (int r = 0; r < size_; ++r) {
      const int nr = node_rank_[static_cast<size_t>(r)];
      if (nr == MPI_UNDEFINED) continue;
      MPI_Aint peer_size = 0;
      int disp_unit = 0;
      void* ptr = nullptr;
      check(MPI_Win_shared_query(w.shm, nr, &peer_size, &disp_unit, &ptr), "MPI_Win_shared_query");
      w.peers[static_cast<size_t>(r)] = static_cast<std::byte*>(ptr);
    }
    check(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.shm), "MPI_Win_lock_all");
    if (spans_nodes_) {
      check(MPI_Win_create(base, size, 1, MPI_INFO_NULL, group_, &w.rma), "MPI_Win_create");
      MPI_Win_set_errhandler(w.rma, MPI_ERRORS_RETURN);
      check(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.rma), "MPI_Win_lock_all");
    }
  } else {
    check(MPI_Win_allocate(size, 1, MPI_INFO_NULL, group_, &base, &w.rma), "MPI_Win_allocate");
    MPI_Win_set_errhandler(w.rma, MPI_ERRORS_RETURN);
    check(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.rma), "MPI_Win_lock_all");
  }
  w.base = static_cast<std::byte*>(base);
  std::memset(w.base, 0, static_cast<size_t>(size));
  return w;
}

void MpiHeap::free_window(Window& w) {
  if (w.rma != MPI_WIN_NULL) {
    MPI_Win_unlock_all(w.rma);
    MPI_Win_free(&w.rma);
  }
  if (w.shm != MPI_WIN_NULL) {
    MPI_Win_unlock_all(w.shm);
    MPI_Win_free(&w.shm);
  }
}

BufferId MpiHeap::allocate(const std::string& name, size_t bytes, MemCategory category) {
  const auto id = static_cast<BufferId>(buffers_.size());
  Request mine = request_of(name, bytes);
  std::vector<Request> all(static_cast<size_t>(size_));
  MPI_Request r;
  check(MPI_Iallgather(&mine, sizeof(Request), MPI_BYTE, all.data(), sizeof(Request), MPI_BYTE, group_, &r),
        "MPI_Iallgather");
  wait(r, "allocate", name_, timeout_seconds_);
  // Every member compares every request with member 0's, so all of them report the same mismatch.
  std::string differences;
  for (size_t m = 1; m < all.size(); ++m)
    if (!same(all[m], all[0]))
      differences += fmt::format("; rank {} allocates '{}' of {} bytes", m, all[m].name, all[m].bytes);
  EXPAR_CHECK(
      differences.empty(),
      "symmetric heap on group '{}': allocation #{} differs between members: rank 0 allocates '{}' of {} "
      "bytes{}; every member must allocate the same buffers in the same order with the same sizes",
      name_, id, all[0].name, all[0].bytes, differences);
  Buffer b;
  b.name = name;
  b.bytes = bytes;
  b.category = category;
  b.window = create_window(bytes);
  b.tracker = &current_tracker();
  b.tracker->add(category, static_cast<int64_t>(bytes));
  buffers_.push_back(std::move(b));
  barrier();  // every member's zero fill is done before anyone writes
  return id;
}

const MpiHeap::Buffer& MpiHeap::buffer_at(BufferId buffer, const char* op) const {
  EXPAR_ASSERT(
      buffer >= 0 && static_cast<size_t>(buffer) < buffers_.size(),
      "{}: buffer id {} does not exist on heap '{}' ({} buffers allocated); use an id allocate() returned",
      op, buffer, name_, buffers_.size());
  return buffers_[static_cast<size_t>(buffer)];
}

void MpiHeap::check_range(int peer, const Buffer& b, size_t offset, size_t bytes, const char* op) const {
  EXPAR_ASSERT(peer >= 0 && peer < size_, "{}: peer {} is outside heap '{}' of {} members", op, peer, name_,
               size_);
  EXPAR_ASSERT(offset <= b.bytes && bytes <= b.bytes - offset,
               "{}: bytes [{}, {}) are outside buffer '{}' of {} bytes", op, offset, offset + bytes, b.name,
               b.bytes);
}

void* MpiHeap::local(BufferId buffer) {
  return buffer_at(buffer, "local").window.base;
}

size_t MpiHeap::bytes(BufferId buffer) const {
  return buffer_at(buffer, "bytes").bytes;
}

void MpiHeap::put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) {
  auto& b = const_cast<Buffer&>(buffer_at(buffer, "put"));
  check_range(peer, b, offset, bytes, "put");
  if (bytes == 0) return;
  count_put(peer, bytes);
  if (std::byte* p = b.window.peers[static_cast<size_t>(peer)]) {
    std::memcpy(p + offset, src, bytes);
    return;
  }
  const int n = to_int(bytes, "put");
  check(MPI_Put(src, n, MPI_BYTE, peer, static_cast<MPI_Aint>(offset), n, MPI_BYTE, b.window.rma), "MPI_Put");
  b.window.pending = true;
}

void MpiHeap::get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) {
  auto& b = const_cast<Buffer&>(buffer_at(buffer, "get"));
  check_range(peer, b, offset, bytes, "get");
  if (bytes == 0) return;
  count_get(peer, bytes);
  if (std::byte* p = b.window.peers[static_cast<size_t>(peer)]) {
    std::memcpy(dst, p + offset, bytes);
    return;
  }
  const int n = to_int(bytes, "get");
  check(MPI_Get(dst, n, MPI_BYTE, peer, static_cast<MPI_Aint>(offset), n, MPI_BYTE, b.window.rma), "MPI_Get");
  b.window.pending = true;
}

void MpiHeap::quiet() {
  for (auto& b : buffers_) {
    if (!b.window.pending) continue;
    // A flush to another node waits for the target's progress engine (osc pt2pt): a stopped target would
    // hold it forever, and MPI_Win_flush_all has no non-blocking form, so it runs under the watchdog.
    BlockingDeadline deadline("quiet (MPI_Win_flush_all)", name_, timeout_seconds_);
    check(MPI_Win_flush_all(b.window.rma), "MPI_Win_flush_all");
    b.window.pending = false;
  }
  // Copies through peer pointers are complete when they return; signal() publishes them with a release store
  // and barrier() with MPI_Win_sync.
}

void MpiHeap::sync_memory() {
  auto sync = [](const Window& w) {
    if (w.shm != MPI_WIN_NULL) MPI_Win_sync(w.shm);
    if (w.rma != MPI_WIN_NULL) MPI_Win_sync(w.rma);
  };
  for (const auto& b : buffers_) sync(b.window);
  sync(signals_);
}

void MpiHeap::barrier() {
  quiet();
  sync_memory();
  MPI_Request r;
  check(MPI_Ibarrier(group_, &r), "MPI_Ibarrier");
  wait(r, "heap barrier", name_, timeout_seconds_);
  sync_memory();
}

void* MpiHeap::peer_ptr(int peer, BufferId buffer) {
  const auto& b = buffer_at(buffer, "peer_ptr");
  check_range(peer, b, 0, 0, "peer_ptr");
  return b.window.peers[static_cast<size_t>(peer)];
}

void MpiHeap::signal(int peer, int slot, uint64_t value) {
  EXPAR_ASSERT(peer >= 0 && peer < size_, "signal: peer {} is outside heap '{}' of {} members", peer, name_,
               size_);
  EXPAR_ASSERT(slot >= 0 && slot < kSignalSlots, "signal: slot {} is outside [0, {})", slot, kSignalSlots);
  quiet();  // my earlier puts are complete at their targets before the signal can be seen
  if (std::byte* p = signals_.peers[static_cast<size_t>(peer)]) {
    std::atomic_ref<uint64_t>(*slot_at(p, slot)).store(value, std::memory_order_release);
    return;
  }
  check(MPI_Accumulate(&value, 1, MPI_UINT64_T, peer, static_cast<MPI_Aint>(slot) * 8, 1, MPI_UINT64_T,
                       MPI_REPLACE, signals_.rma),
        "MPI_Accumulate");
  BlockingDeadline deadline("signal (MPI_Win_flush)", name_, timeout_seconds_);
  check(MPI_Win_flush(peer, signals_.rma), "MPI_Win_flush");
}

void MpiHeap::wait_signal(int slot, uint64_t value) {
  EXPAR_ASSERT(slot >= 0 && slot < kSignalSlots, "wait_signal: slot {} is outside [0, {})", slot,
               kSignalSlots);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds_);
  for (;;) {
    uint64_t seen = 0;
    if (spans_nodes_) {
      // Across nodes the one-sided component is osc pt2pt: a peer's MPI_Put/MPI_Accumulate to me lands only
      // when MY process drives MPI's progress engine, and the peer's signal() waits for that in its flush.
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, group_, &flag, MPI_STATUS_IGNORE);
    }
    if (std::byte* p = signals_.peers[static_cast<size_t>(rank_)]) {
      seen = std::atomic_ref<uint64_t>(*slot_at(p, slot)).load(std::memory_order_acquire);
    } else {
      // Accumulate-family reads are atomic with the peers' MPI_Accumulate writes.
      check(MPI_Fetch_and_op(nullptr, &seen, MPI_UINT64_T, rank_, static_cast<MPI_Aint>(slot) * 8, MPI_NO_OP,
                             signals_.rma),
            "MPI_Fetch_and_op");
      check(MPI_Win_flush(rank_, signals_.rma), "MPI_Win_flush");
    }
    if (seen >= value) {
      sync_memory();  // make the data the peer put before signalling visible to my loads
      return;
    }
    EXPAR_CHECK(
        std::chrono::steady_clock::now() < deadline,
        "wait_signal(slot {}, value {}) on heap '{}' rank {} (slot is at {}) timed out after {} s; raise "
        "EXPAR_COMM_TIMEOUT if the peer is just slow",
        slot, value, name_, rank_, seen, timeout_seconds_);
    sched_yield();
  }
}

}  // namespace expar::mpi
