#include "expar/moe/lease_pool.hpp"

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

LeasePool::LeasePool(SymmetricHeap& heap, std::string name, size_t slot_bytes, bool debug_generations)
    : heap_(heap), name_(std::move(name)), slot_bytes_(slot_bytes), debug_(debug_generations) {}

LeasePool::Handle LeasePool::acquire(LeaseTag tag) {
  int chosen = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].leased) {
      chosen = static_cast<int>(i);
      break;
    }
  }
  if (chosen < 0) {
    EXPAR_CHECK(
        !frozen_,
        "lease pool '{}' is frozen with {} slots, all leased, and block {} microbatch {} needs one more "
        "({} slots needed): the pool is sized by the dry-run step (the first step of `expar train`), so "
        "every later step must keep no more MoE forwards in flight than it did: run the dry run with the "
        "schedule of the steps that follow (the same --microbatches and --recompute-moe)",
        name_, slots_.size(), tag.block, tag.microbatch, slots_.size() + 1);
    Slot s;
    s.buffer = heap_.allocate(name_ + ".slot" + std::to_string(slots_.size()), slot_bytes_,
                              MemCategory::SymmetricBuffers);
    slots_.push_back(s);
    chosen = static_cast<int>(slots_.size()) - 1;
  }
  Slot& s = slots_[static_cast<size_t>(chosen)];
  s.leased = true;
  s.holder = tag;
  ++s.generation;
  high_water_ = std::max(high_water_, leased_count());
  return Handle{chosen, s.generation, s.buffer, tag, true};
}

LeasePool::Handle LeasePool::acquire_scratch(LeaseTag tag, int which) {
  EXPAR_ASSERT(which >= 0 && which < kScratchSlots,
               "lease pool '{}': scratch slot {} requested by block {} does not exist: use 0 .. {}", name_,
               which, tag.block, kScratchSlots - 1);
  Slot& s = scratch_[which];
  if (s.buffer < 0) {
    EXPAR_CHECK(!frozen_,
                "lease pool '{}' is frozen and block {} microbatch {} asks for shared scratch slot {}, which "
                "the dry-run step never used: resident symmetric memory may not grow after the dry run, so "
                "run the dry run with every pass the later steps make (the same --recompute-moe)",
                name_, tag.block, tag.microbatch, which);
    s.buffer = heap_.allocate(name_ + ".scratch" + (which == 0 ? std::string() : std::to_string(which)),
                              slot_bytes_, MemCategory::SymmetricBuffers);
  }
  ++s.generation;
  s.holder = tag;
  return Handle{-1 - which, s.generation, s.buffer, tag, false};
}

void LeasePool::release(Handle& handle) {
  EXPAR_ASSERT(handle.leased,
               "lease pool '{}': release of a handle of block {} microbatch {} that holds no lease", name_,
               handle.tag.block, handle.tag.microbatch);
  Slot& s = slots_.at(static_cast<size_t>(handle.slot));
  EXPAR_ASSERT(
      s.leased && s.generation == handle.generation,
      "lease pool '{}': slot {} released twice (block {} microbatch {}): release each lease exactly once, "
      "after its last consumer",
      name_, handle.slot, handle.tag.block, handle.tag.microbatch);
  s.leased = false;
  handle.leased = false;
}

void LeasePool::check(const Handle& handle) const {
  if (!debug_) return;
  const Slot& s = handle.slot < 0 ? scratch_[-1 - handle.slot] : slots_.at(static_cast<size_t>(handle.slot));
  EXPAR_ASSERT(
      s.generation == handle.generation,
      "lease pool '{}': the payload saved by block {} microbatch {} in {} was overwritten by block {} "
      "microbatch {} (generation {} -> {}) before its backward read it: lease the buffer "
      "instead of sharing it, or recompute the payload",
      name_, handle.tag.block, handle.tag.microbatch,
      handle.slot < 0 ? fmt::format("shared scratch slot {}", -1 - handle.slot)
                      : fmt::format("slot {}", handle.slot),
      s.holder.block, s.holder.microbatch, handle.generation, s.generation);
}

void* LeasePool::data(const Handle& handle) {
  return heap_.local(handle.buffer);
}

void LeasePool::freeze() {
  frozen_ = true;
}

int LeasePool::leased_count() const {
  int n = 0;
  for (const auto& s : slots_) n += s.leased ? 1 : 0;
  return n;
}

int LeasePool::scratch_count() const {
  int n = 0;
  for (const auto& s : scratch_) n += s.buffer >= 0 ? 1 : 0;
  return n;
}

size_t LeasePool::resident_bytes() const {
  return slot_bytes_ * (slots_.size() + static_cast<size_t>(scratch_count()));
}

}  // namespace expar
