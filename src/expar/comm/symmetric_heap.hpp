#pragma once
// SymmetricHeap: buffers allocated collectively by every member of one group (same names, same sizes, same
// order: a mismatch is detected and reported as expar::Error on every member, never undefined behaviour),
// addressable by (peer, buffer, offset): one-sided put/get, quiet (my operations are complete), barrier
// (quiet + every member's writes visible to all), peer_ptr (a direct load/store pointer where the peer's
// memory is reachable, null otherwise), and signals for point-to-point readiness.
#include <cstddef>
#include <cstdint>
#include <string>

#include "expar/comm/comm.hpp"
#include "expar/core/memory.hpp"

namespace expar {

using BufferId = int;

class SymmetricHeap {
 public:
  virtual ~SymmetricHeap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective. Returns the buffer's id (the same on every member). Charged to `category` of the caller's
  // memory tracker.
  virtual BufferId allocate(const std::string& name, size_t bytes,
                            MemCategory category = MemCategory::SymmetricBuffers) = 0;
  virtual void* local(BufferId buffer) = 0;
  virtual size_t bytes(BufferId buffer) const = 0;

  // Copy `bytes` from local `src` to peer's buffer at byte `offset` (one-sided; complete after quiet()).
  virtual void put(int peer, BufferId buffer, size_t offset, const void* src, size_t bytes) = 0;
  // Copy `bytes` from peer's buffer at byte `offset` into local `dst` (complete after quiet()).
  virtual void get(int peer, BufferId buffer, size_t offset, void* dst, size_t bytes) = 0;
  virtual void quiet() = 0;
  // Collective: quiet() on every member, then every member's writes are visible to all.
  virtual void barrier() = 0;
  // Direct pointer to peer's buffer, or nullptr where it is not load/store accessible.
  virtual void* peer_ptr(int peer, BufferId buffer) = 0;

  // Signals: each member owns `kSignalSlots` 64-bit slots. signal() sets peer's slot (after my earlier puts
  // to that peer are complete); wait_signal() blocks until my slot reaches at least `value`.
  static constexpr int kSignalSlots = 64;
  virtual void signal(int peer, int slot, uint64_t value) = 0;
  virtual void wait_signal(int slot, uint64_t value) = 0;

  // The nodes of the members (the group's Comm::nodes()). A peer on another node is never load/store
  // accessible (peer_ptr is null), so every row to it is a put() or get() and is counted below.
  const NodeMap& nodes() const { return nodes_; }
  // One message per put() and per get() of at least one byte this member issued, within or across nodes.
  // Copies through peer_ptr are loads and stores, not messages, and are not counted.
  struct Stats {
    TrafficStats puts, gets;
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  void count_put(int peer, size_t bytes) {
    if (bytes > 0) stats_.puts.add(nodes_.across(rank(), peer), bytes);
  }
  void count_get(int peer, size_t bytes) {
    if (bytes > 0) stats_.gets.add(nodes_.across(rank(), peer), bytes);
  }

  NodeMap nodes_;  // set by the backend's constructor
  Stats stats_;
};

}  // namespace expar
