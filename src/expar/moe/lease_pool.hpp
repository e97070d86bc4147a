#pragma once
// Symmetric-buffer leases (seed 000 §5.7, Figures 20-22).
//
// The rowwise dispatch buffer is read in place by the up-projection, which saves it as its Wgrad input, so
// its payload must survive until that block's backward. Each MoE block and microbatch therefore LEASES a
// slot of symmetric memory from a pool; backward releases the lease after its last consumer. A leased slot
// is never handed out again; a second release is an error. The pool grows only during a dry run before
// training (each growth is a collective allocation, so every member of the heap's group must acquire in the
// same order) and is then frozen: a frozen pool that runs out says how many slots were needed and how to
// raise the limit.
//
// Scratch (the expert-output buffer, read only by the combine transfer; or a dispatch payload that
// activation recomputation will rebuild) uses SHARED slots across blocks: no lease. A pool has up to
// kScratchSlots of them, one per role a user names (`which`), because one block step may need two scratch
// payloads at once (under recomputation the rowwise experts read the dispatch payload from one scratch slot
// while writing their output into another); each is allocated on first use and stays resident.
//
// Debug generations: every acquisition of a slot (leased or scratch) bumps that slot's generation and the
// holder remembers the generation it got; a consumer calls check() before reading, so a payload that a
// later forward overwrote fails loudly instead of silently feeding Wgrad stale rows (Figure 21's hazard).
#include <cstdint>
#include <string>
#include <vector>

#include "expar/comm/symmetric_heap.hpp"

namespace expar {

struct LeaseTag {
  int block = -1;
  int microbatch = -1;
};

class LeasePool {
 public:
  struct Handle {
    int slot = -1;  // < 0: the shared scratch slot -1 - slot (0 .. kScratchSlots - 1)
    uint64_t generation = 0;
    BufferId buffer = -1;
    LeaseTag tag;
    bool leased = false;
  };

  static constexpr int kScratchSlots = 2;

  LeasePool(SymmetricHeap& heap, std::string name, size_t slot_bytes, bool debug_generations = true);

  // Collective (same order on every member). Leases a free slot for (block, microbatch).
  Handle acquire(LeaseTag tag);
  // Shared scratch slot `which` in [0, kScratchSlots) (collective on first use, which allocates it; refused
  // once frozen, like any growth); bumps its generation.
  Handle acquire_scratch(LeaseTag tag, int which = 0);
  void release(Handle& handle);
  // Throws expar::Error if the slot was re-acquired since `handle` was taken (its payload was overwritten).
  void check(const Handle& handle) const;

  void* data(const Handle& handle);
  BufferId buffer(const Handle& handle) const { return handle.buffer; }

  // After the dry run: no more growth (neither leased nor scratch slots).
  void freeze();
  bool frozen() const { return frozen_; }
  // Upper limit on slots, for growth after freeze is refused with this number in the message.
  int slot_count() const { return static_cast<int>(slots_.size()); }
  int leased_count() const;
  int high_water() const { return high_water_; }
  // Scratch slots allocated so far (resident, not counted in slot_count()).
  int scratch_count() const;
  size_t slot_bytes() const { return slot_bytes_; }
  // Resident symmetric bytes of this pool on each member (leased slots + scratch).
  size_t resident_bytes() const;

 private:
  struct Slot {
    BufferId buffer = -1;
    uint64_t generation = 0;
    bool leased = false;
    LeaseTag holder;
  };
  SymmetricHeap& heap_;
  std::string name_;
  size_t slot_bytes_;
  bool debug_;
  bool frozen_ = false;
  int high_water_ = 0;
  std::vector<Slot> slots_;
  Slot scratch_[kScratchSlots];
};

}  // namespace expar
