#pragma once
// The threads backend's rendezvous. Every group (the world, each split, each heap) shares one GroupState
// between its member threads. A collective is one or two generations of exchange(): each member publishes
// a Slot (its pointers and arguments) under the group lock, waits until every member has published for this
// generation, then reads any member's slot without the lock. Slots alternate between two banks by
// generation parity, so a slot is only overwritten two generations later, after every member has moved on:
// no closing wait is needed to read slots, only to keep the members' user buffers alive while peers copy.
//
// Every wait ends with an expar::Error, never blocks forever: when the run is aborted (another rank threw),
// when a member that has not arrived already returned from its rank function, or after the timeout.
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "expar/core/dtype.hpp"

namespace expar::threads {

class GroupState;

// What every rank of one run_ranks call shares: the timeout, the abort flag and the list of groups whose
// waiters must be woken when the run aborts or a rank returns.
class ThreadsWorld {
 public:
  // ranks_per_node: world ranks [n*k, (n+1)*k) form emulated node n (ranks: one node).
  // spin_seconds: how long a waiter polls before it sleeps on the condition variable (0: sleep at once).
  ThreadsWorld(int ranks, double timeout_seconds, int ranks_per_node, double spin_seconds = 0.0);
  int ranks() const { return ranks_; }
  double spin_seconds() const { return spin_seconds_; }
  int ranks_per_node() const { return ranks_per_node_; }
  double timeout_seconds() const { return timeout_seconds_; }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  // Sets the abort flag (the first reason is kept) and wakes every waiter of every group.
  void abort(const std::string& reason);
  // Records that world rank `rank` returned from its function, and wakes waiters so that a wait for it
  // fails at once instead of timing out.
  void mark_finished(int rank);
  bool finished(int rank) const {
    return finished_[static_cast<size_t>(rank)].load(std::memory_order_acquire);
  }

  void register_group(const std::shared_ptr<GroupState>& group);

 private:
  void wake_all();

  int ranks_;
  double timeout_seconds_;
  int ranks_per_node_;
  double spin_seconds_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<std::atomic<bool>[]> finished_;
  mutable std::mutex mutex_;
  std::string abort_reason_;
  std::vector<std::weak_ptr<GroupState>> groups_;
};

// One member's contribution to a generation. Which fields mean what is up to the collective. Every field
// has an initializer, so a collective can name just the ones it uses ({.send = ..., .count = ...}).
struct Slot {
  const char* op = nullptr;  // the operation's name: members calling different operations is an error
  const void* send = nullptr;
  void* recv = nullptr;
  std::span<const size_t> counts{};
  std::span<const size_t> counts2{};
  size_t count = 0;
  int64_t a = 0;
  int64_t b = 0;
  DType dtype = DType::U8;
  std::shared_ptr<void> object{};  // an object one member creates for all (a new group's state)
};

class GroupState {
 public:
  // Creates the state and registers it with the world (so that aborts wake its waiters).
  static std::shared_ptr<GroupState> create(std::shared_ptr<ThreadsWorld> world, std::vector<int> world_ranks,
                                            std::string name);
  GroupState(std::shared_ptr<ThreadsWorld> world, std::vector<int> world_ranks, std::string name);

  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  const std::string& name() const { return name_; }
  ThreadsWorld& world() { return *world_; }
  const std::shared_ptr<ThreadsWorld>& world_ptr() const { return world_; }

  // Publishes `slot` as group member `rank`, waits for every member, checks that all called the same
  // operation and returns every member's slot (readable until this member's next exchange returns).
  std::span<const Slot> exchange(int rank, Slot slot);
  // A generation without data (a barrier, or the closing wait that keeps user buffers alive).
  void wait(int rank, const char* op);

  // Point-to-point waiting on state guarded by this group's lock (the heap's signals). update() runs under
  // the lock and wakes waiters; wait_until() blocks until ready() (run under the lock) holds, failing on
  // abort or timeout with the message describe() gives.
  void update(const std::function<void()>& change);
  void wait_until(const std::function<bool()>& ready, const std::function<std::string()>& describe);

  // Wakes every waiter (used by the world on abort).
  void notify_all();

 private:
  // Polls generation_ without the lock until it moves on, the run aborts or the world's spin time is up
  // (the caller then checks under the lock either way).
  void spin_until_generation_moves(uint64_t generation) const;

  std::shared_ptr<ThreadsWorld> world_;
  std::vector<int> world_ranks_;
  std::string name_;

  std::mutex mutex_;
  std::condition_variable cv_;
  // Written under mutex_ (release), so that a spinning waiter may read it without the lock (acquire).
  std::atomic<uint64_t> generation_{0};
  int arrived_ = 0;
  std::vector<char> has_arrived_;
  std::array<std::vector<Slot>, 2> banks_;
};

}  // namespace expar::threads
