#include "expar/comm/threads/threads_heap.hpp"

#include <cstring>
#include <new>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar::threads {

void AlignedFree::operator()(std::byte* p) const {
  ::operator delete[](p, std::align_val_t{64});
}

AlignedBytes allocate_aligned(size_t bytes) {
  const size_t n = bytes == 0 ? 1 : bytes;
  auto* p = static_cast<std::byte*>(::operator new[](n, std::align_val_t{64}));
  std::memset(p, 0, n);
  return AlignedBytes(p);
}

HeapShared::HeapShared(const std::shared_ptr<GroupState>& parent)
    : group(GroupState::create(parent->world_ptr(), parent->world_ranks(), parent->name() + ".heap")),
      owned(static_cast<size_t>(parent->size())),
      signals(static_cast<size_t>(parent->size())) {
  for (auto& s : signals) s.fill(0);
}

ThreadsHeap::ThreadsHeap(std::shared_ptr<HeapShared> shared, int rank, NodeMap nodes)
    : shared_(std::move(shared)), rank_(rank) {
  nodes_ = std::move(nodes);
}

ThreadsHeap::~ThreadsHeap() {
  for (auto& b : buffers_) b.tracker->sub(b.category, static_cast<int64_t>(b.bytes));
}

BufferId ThreadsHeap::allocate(const std::string& name, size_t bytes, MemCategory category) {
  const auto id = static_cast<BufferId>(buffers_.size());
  AlignedBytes memory = allocate_aligned(bytes);
  Slot mine;
  mine.op = "allocate";
  mine.send = &name;
  mine.recv = memory.get();
  mine.count = bytes;
  auto slots = shared_->group->exchange(rank_, std::move(mine));
  // Every member compares every member's request with member 0's, so all of them report the same mismatch.
  const auto& name0 = *static_cast<const std::string*>(slots[0].send);
  std::string differences;
  for (size_t m = 1; m < slots.size(); ++m) {
    const auto& name_m = *static_cast<const std::string*>(slots[m].send);
    if (name_m != name0 || slots[m].count != slots[0].count)
      differences += fmt::format("; rank {} allocates '{}' of {} bytes", m, name_m, slots[m].count);
  }
  if (!differences.empty()) {
    auto message = fmt::format(
        "symmetric heap on group '{}': allocation #{} differs between members: rank 0 allocates '{}' of {} "
        "bytes{}; every member must allocate the same buffers in the same order with the same sizes",
        shared_->group->name(), id, name0, slots[0].count, differences);
    // Let every member finish reading the names before any of them unwinds and frees its string.
    shared_->group->wait(rank_, "allocate (mismatch)");
    throw Error(message);
  }
  Buffer b;
  b.name = name;
  b.bytes = bytes;
  b.category = category;
  b.tracker = &current_tracker();
  for (const auto& s : slots) b.peers.push_back(static_cast<std::byte*>(s.recv));
  shared_->owned[static_cast<size_t>(rank_)].push_back(std::move(memory));
  b.tracker->add(category, static_cast<int64_t>(bytes));
  buffers_.push_back(std::move(b));
  shared_->group->wait(rank_, "allocate (closing)");
  return id;
}

const ThreadsHeap::Buffer& ThreadsHeap::buffer_at(BufferId buffer, const char* op) const {
  EXPAR_ASSERT(
      buffer >= 0 && static_cast<size_t>(buffer) < buffers_.size(),
      "{}: buffer id {} does not exist on heap '{}' ({} buffers allocated); use an id allocate() returned",
      op, buffer, shared_->group->name(), buffers_.size());
  return buffers_[static_cast<size_t>(buffer)];
}

std::byte* ThreadsHeap::remote(int peer, BufferId buffer, size_t offset, size_t bytes, const char* op) {
  const auto& b = buffer_at(buffer, op);
  EXPAR_ASSERT(peer >= 0 && peer < size(), "{}: peer {} is outside heap '{}' of {} members", op, peer,
               shared_->group->name(), size());
  EXPAR_ASSERT(offset <= b.bytes && bytes <= b.bytes - offset,
               "{}: bytes [{}, {}) are outside buffer '{}' of {} bytes", op, offset, offset + bytes, b.name,
               b.bytes);
  return b.peers[static_cast<size_t>(peer)] + offset;
}

void* ThreadsHeap::local(BufferId buffer) {
  return buffer_at(buffer, "local").peers[static_cast<size_t>(rank_)];
}

size_t ThreadsHeap::bytes(BufferId buffer) const {
  return buffer_at(buffer, "bytes").bytes;
}

void ThreadsHeap::put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) {
  std::byte* dst = remote(peer, buffer, offset, bytes, "put");
  count_put(peer, bytes);
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

void ThreadsHeap::get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) {
  const std::byte* src = remote(peer, buffer, offset, bytes, "get");
  count_get(peer, bytes);
  if (bytes != 0) std::memcpy(dst, src, bytes);
}

void ThreadsHeap::barrier() {
  shared_->group->wait(rank_, "heap barrier");
}

void* ThreadsHeap::peer_ptr(int peer, BufferId buffer) {
  std::byte* p = remote(peer, buffer, 0, 0, "peer_ptr");
  return nodes_.across(rank_, peer) ? nullptr : p;
}

void ThreadsHeap::signal(int peer, int slot, uint64_t value) {
  EXPAR_ASSERT(peer >= 0 && peer < size(), "signal: peer {} is outside heap '{}' of {} members", peer,
               shared_->group->name(), size());
  EXPAR_ASSERT(slot >= 0 && slot < kSignalSlots, "signal: slot {} is outside [0, {})", slot, kSignalSlots);
  // Puts are complete when they return; the lock orders them before the peer's wake-up.
  shared_->group->update(
      [&] { shared_->signals[static_cast<size_t>(peer)][static_cast<size_t>(slot)] = value; });
}

void ThreadsHeap::wait_signal(int slot, uint64_t value) {
  EXPAR_ASSERT(slot >= 0 && slot < kSignalSlots, "wait_signal: slot {} is outside [0, {})", slot,
               kSignalSlots);
  auto& cell = shared_->signals[static_cast<size_t>(rank_)][static_cast<size_t>(slot)];
  shared_->group->wait_until([&] { return cell >= value; },
                             [&] {
                               return fmt::format(
                                   "wait_signal(slot {}, value {}) on heap '{}' rank {} (slot is at {})",
                                   slot, value, shared_->group->name(), rank_, cell);
                             });
}

}  // namespace expar::threads
