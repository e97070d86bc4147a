#include "expar/comm/threads/group_state.hpp"

#include <chrono>
#include <cstring>
#include <exception>
#include <string_view>

#include "expar/core/error.hpp"

namespace expar::threads {

ThreadsWorld::ThreadsWorld(int ranks, double timeout_seconds, int ranks_per_node, double spin_seconds)
    : ranks_(ranks),
      timeout_seconds_(timeout_seconds),
      ranks_per_node_(ranks_per_node),
      spin_seconds_(spin_seconds),
      finished_(new std::atomic<bool>[static_cast<size_t>(ranks)]) {
  for (int r = 0; r < ranks; ++r) finished_[static_cast<size_t>(r)].store(false);
}

std::string ThreadsWorld::abort_reason() const {
  std::lock_guard lock(mutex_);
  return abort_reason_;
}

void ThreadsWorld::abort(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (!aborted_.load()) abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  wake_all();
}

void ThreadsWorld::mark_finished(int rank) {
  finished_[static_cast<size_t>(rank)].store(true, std::memory_order_release);
  wake_all();
}

void ThreadsWorld::register_group(const std::shared_ptr<GroupState>& group) {
  std::lock_guard lock(mutex_);
  std::erase_if(groups_, [](const std::weak_ptr<GroupState>& g) { return g.expired(); });
  groups_.push_back(group);
}

void ThreadsWorld::wake_all() {
  // Copy the live groups first: notifying takes each group's lock, never while holding ours.
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard lock(mutex_);
    for (auto& g : groups_)
      if (auto p = g.lock()) live.push_back(std::move(p));
  }
  for (auto& g : live) g->notify_all();
}

std::shared_ptr<GroupState> GroupState::create(std::shared_ptr<ThreadsWorld> world,
                                               std::vector<int> world_ranks, std::string name) {
  auto state = std::make_shared<GroupState>(world, std::move(world_ranks), std::move(name));
  world->register_group(state);
  return state;
}

GroupState::GroupState(std::shared_ptr<ThreadsWorld> world, std::vector<int> world_ranks, std::string name)
    : world_(std::move(world)), world_ranks_(std::move(world_ranks)), name_(std::move(name)) {
  has_arrived_.assign(world_ranks_.size(), 0);
  for (auto& bank : banks_) bank.resize(world_ranks_.size());
}

void GroupState::notify_all() {
  // Taking the lock orders the notification after any waiter's check of the flags (no lost wake-up).
  std::lock_guard lock(mutex_);
  cv_.notify_all();
}

std::span<const Slot> GroupState::exchange(int rank, Slot slot) {
  const char* op = slot.op;
  const size_t n = world_ranks_.size();
  std::unique_lock lock(mutex_);
  // After an abort no generation may complete: peers that gave up have left, and their buffers with them.
  if (world_->aborted())
    fail("{} on group '{}' (group rank {}) abandoned: {}", op, name_, rank, world_->abort_reason());
  const uint64_t generation = generation_;
  auto& bank = banks_[generation % 2];
  bank[static_cast<size_t>(rank)] = std::move(slot);
  has_arrived_[static_cast<size_t>(rank)] = 1;
  if (++arrived_ == static_cast<int>(n)) {
    arrived_ = 0;
    std::fill(has_arrived_.begin(), has_arrived_.end(), 0);
    generation_.store(generation + 1, std::memory_order_release);
    cv_.notify_all();
  } else {
    // A wake-up through the condition variable costs tens of microseconds (more in a VM whose idle core
    // sleeps), once or twice per collective: a decode step's many small collectives were spending most of
    // their time there. When every rank has a core of its own, poll first.
    if (world_->spin_seconds() > 0) {
      lock.unlock();
      spin_until_generation_moves(generation);
      lock.lock();
    }
    // A member that leaves by throwing withdraws its arrival, so the generation can never complete with it.
    struct Withdraw {
      GroupState* g;
      size_t rank;
      uint64_t generation;
      int exceptions = std::uncaught_exceptions();
      ~Withdraw() {
        if (std::uncaught_exceptions() > exceptions && g->generation_ == generation) {
          g->has_arrived_[rank] = 0;
          --g->arrived_;
        }
      }
    } withdraw{this, static_cast<size_t>(rank), generation};
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(world_->timeout_seconds());
    while (generation_ == generation) {
      if (world_->aborted())
        fail("{} on group '{}' (group rank {}) abandoned: {}", op, name_, rank, world_->abort_reason());
      std::vector<int> missing;
      bool missing_finished = false;
      for (size_t m = 0; m < n; ++m) {
        if (has_arrived_[m]) continue;
        missing.push_back(static_cast<int>(m));
        missing_finished = missing_finished || world_->finished(world_ranks_[m]);
      }
      if (missing_finished)
        fail(
            "{} on group '{}': group ranks {} never arrived (at least one of them already returned from its "
            "rank "
            "function); every member of a group must call the same collectives in the same order",
            op, name_, missing);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation) {
        missing.clear();
        std::vector<int> late_world;
        for (size_t m = 0; m < n; ++m) {
          if (has_arrived_[m]) continue;
          missing.push_back(static_cast<int>(m));
          late_world.push_back(world_ranks_[m]);
        }
        fail(
            "{} on group '{}' timed out after {} s: group ranks {} (world ranks {}) did not arrive; raise "
            "EXPAR_COMM_TIMEOUT if they are just slow",
            op, name_, world_->timeout_seconds(), missing, late_world);
      }
    }
  }
  lock.unlock();
  std::span<const Slot> slots(bank);
  // Every member sees the same slots, so a mismatch is reported identically by all of them.
  for (size_t m = 0; m < n; ++m) {
    if (std::string_view(slots[m].op) != std::string_view(op))
      fail(
          "collective mismatch on group '{}': group rank {} called {} while group rank {} called {}; every "
          "member must call the same collectives in the same order",
          name_, rank, op, m, slots[m].op);
  }
  return slots;
}

void GroupState::spin_until_generation_moves(uint64_t generation) const {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(world_->spin_seconds());
  for (uint32_t i = 1;; ++i) {
    if (generation_.load(std::memory_order_acquire) != generation) return;
    // The clock and the abort flag every 256 polls: an aborted run sleeps below and is woken with the rest.
    if (i % 256 == 0 && (world_->aborted() || std::chrono::steady_clock::now() >= deadline)) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

void GroupState::wait(int rank, const char* op) {
  Slot slot;
  slot.op = op;
  exchange(rank, std::move(slot));
}

void GroupState::update(const std::function<void()>& change) {
  std::lock_guard lock(mutex_);
  change();
  cv_.notify_all();
}

void GroupState::wait_until(const std::function<bool()>& ready,
                            const std::function<std::string()>& describe) {
  std::unique_lock lock(mutex_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(world_->timeout_seconds());
  while (!ready()) {
    if (world_->aborted()) fail("{} abandoned: {}", describe(), world_->abort_reason());
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready())
      fail("{} timed out after {} s; raise EXPAR_COMM_TIMEOUT if the peer is just slow", describe(),
           world_->timeout_seconds());
  }
}

}  // namespace expar::threads
