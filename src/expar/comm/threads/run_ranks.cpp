// run_ranks: the threads backend's launcher.
#include <algorithm>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <numeric>
#include <thread>

#include "expar/comm/comm_env.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/threads/group_state.hpp"
#include "expar/comm/threads/threads_comm.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

std::vector<MemorySnapshot> run_ranks_tracked(const LaunchOptions& options,
                                              const std::function<void(Comm& world)>& fn) {
  EXPAR_CHECK(options.ranks >= 1, "ranks = {}: run at least 1 rank", options.ranks);
  EXPAR_CHECK(options.ranks <= kMaxLaunchRanks, "ranks = {}: at most {} ranks run as threads of one process",
              options.ranks, kMaxLaunchRanks);
  EXPAR_CHECK(options.compute_threads >= 1 && options.compute_threads <= kMaxComputeThreads,
              "compute_threads = {}: use 1 to {} compute threads per rank", options.compute_threads,
              kMaxComputeThreads);
  EXPAR_CHECK(options.timeout_seconds > 0, "timeout_seconds = {}: the wait timeout must be positive",
              options.timeout_seconds);
  EXPAR_CHECK(options.ranks_per_node >= 0 &&
                  (options.ranks_per_node == 0 || options.ranks % options.ranks_per_node == 0),
              "ranks_per_node = {} with {} ranks: the emulated nodes must all hold the same number of ranks; "
              "choose a divisor of {} (or 0: all ranks on one node)",
              options.ranks_per_node, options.ranks, options.ranks);
  const int n = options.ranks;
  // Waiters poll for up to 2 ms before sleeping when every rank's threads have cores of their own; with
  // more threads than cores a poller would take the core from the rank it waits for.
  const bool own_cores = static_cast<int64_t>(n) * options.compute_threads <=
                         static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  auto world = std::make_shared<threads::ThreadsWorld>(
      n, comm_timeout_seconds(options.timeout_seconds),
      options.ranks_per_node == 0 ? n : options.ranks_per_node, own_cores ? 2e-3 : 0.0);
  std::vector<int> members(static_cast<size_t>(n));
  std::iota(members.begin(), members.end(), 0);
  auto group = threads::GroupState::create(world, members, "world");

  std::deque<MemoryTracker> trackers(static_cast<size_t>(n));  // atomics: neither movable nor copyable
  std::vector<MemorySnapshot> snapshots(static_cast<size_t>(n));
  std::mutex error_mutex;
  int first_rank = -1;
  std::string first_message;

  auto body = [&](int r) {
    TrackerBinding binding(trackers[static_cast<size_t>(r)]);
    std::string message;
    bool failed = false;
    try {
      set_compute_threads(options.compute_threads);
      threads::ThreadsComm comm(group, r);
      fn(comm);
    } catch (const std::bad_alloc&) {
      failed = true;
      message =
          "out of memory: this rank could not allocate what it needs; use fewer ranks or a smaller "
          "model, batch or sequence";
    } catch (const std::exception& e) {
      failed = true;
      message = e.what();
    } catch (...) {
      failed = true;
      message = "unknown exception (not derived from std::exception)";
    }
    if (failed) {
      {
        std::lock_guard lock(error_mutex);
        if (first_rank < 0) {
          first_rank = r;
          first_message = message;
        }
      }
      world->abort(fmt::format("rank {} failed: {}", r, message));
    }
    world->mark_finished(r);
    snapshots[static_cast<size_t>(r)] = trackers[static_cast<size_t>(r)].snapshot();
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  if (first_rank >= 0) fail("rank {}: {}", first_rank, first_message);
  return snapshots;
}

void run_ranks(const LaunchOptions& options, const std::function<void(Comm& world)>& fn) {
  run_ranks_tracked(options, fn);
}

}  // namespace expar
