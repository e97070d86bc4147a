#pragma once
// SymmetricHeap for the threads backend. Every member allocates its own buffers (charged to its own
// tracker); put/get are plain copies into or out of the peer's memory, so they are complete when they
// return and quiet() has nothing to wait for; peer_ptr works for every peer on this member's emulated node
// (LaunchOptions::ranks_per_node) and is null across nodes, as it would be between machines. The memory
// itself is owned by the state all members share, so a member that destroys its heap early never frees memory
// a peer still uses.
#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "expar/comm/symmetric_heap.hpp"
#include "expar/comm/threads/group_state.hpp"

namespace expar::threads {

struct AlignedFree {
  void operator()(std::byte* p) const;
};
using AlignedBytes = std::unique_ptr<std::byte[], AlignedFree>;
// Zero-filled, 64-byte aligned, never null (a zero-byte buffer gets one byte).
AlignedBytes allocate_aligned(size_t bytes);

// Shared by the members of one heap.
struct HeapShared {
  explicit HeapShared(const std::shared_ptr<GroupState>& parent);
  std::shared_ptr<GroupState> group;             // the heap's own rendezvous and lock
  std::vector<std::vector<AlignedBytes>> owned;  // [member] -> its buffers; only that member appends
  std::vector<std::array<uint64_t, SymmetricHeap::kSignalSlots>>
      signals;  // [member][slot], under group's lock
};

class ThreadsHeap final : public SymmetricHeap {
 public:
  ThreadsHeap(std::shared_ptr<HeapShared> shared, int rank, NodeMap nodes);
  ~ThreadsHeap() override;

  int rank() const override { return rank_; }
  int size() const override { return shared_->group->size(); }
  BufferId allocate(const std::string& name, size_t bytes, MemCategory category) override;
  void* local(BufferId buffer) override;
  size_t bytes(BufferId buffer) const override;
  void put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) override;
  void get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) override;
  void quiet() override {}
  void barrier() override;
  void* peer_ptr(int peer, BufferId buffer) override;
  void signal(int peer, int slot, uint64_t value) override;
  void wait_signal(int slot, uint64_t value) override;

 private:
  struct Buffer {
    std::string name;
    size_t bytes = 0;
    MemCategory category = MemCategory::SymmetricBuffers;
    MemoryTracker* tracker = nullptr;
    std::vector<std::byte*> peers;  // [member] -> that member's copy of the buffer
  };
  const Buffer& buffer_at(BufferId buffer, const char* op) const;
  std::byte* remote(int peer, BufferId buffer, size_t offset, size_t bytes, const char* op);

  std::shared_ptr<HeapShared> shared_;
  int rank_;
  std::vector<Buffer> buffers_;
};

}  // namespace expar::threads
