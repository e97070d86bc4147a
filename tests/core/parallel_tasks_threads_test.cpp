// for_each_task (core/parallel_tasks.hpp): every task runs once, on a worker index below task_threads, with
// the caller's batch-invariance setting; the workers' own settings and the caller's are left as they were;
// a task's exception reaches the caller after the other tasks ran. Under ThreadSanitizer for_each_task runs
// the tasks in order on the caller (it cannot see libgomp's barriers), with the same semantics.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "expar/core/matmul.hpp"
#include "expar/core/parallel_tasks.hpp"

namespace expar {
namespace {

struct ThreadsGuard {
  int saved = compute_threads();
  explicit ThreadsGuard(int threads) { set_compute_threads(threads); }
  ~ThreadsGuard() {
    set_compute_threads(saved);
    set_matmul_min_rows(0);
  }
};

TEST(ParallelTasks, WorkerCountIsTheThreadsCappedByTheTasks) {
  ThreadsGuard guard(2);
  EXPECT_EQ(task_threads(0), 1);
  EXPECT_EQ(task_threads(1), 1);
  EXPECT_EQ(task_threads(2), 2);
  EXPECT_EQ(task_threads(9), 2);
  set_compute_threads(1);
  EXPECT_EQ(task_threads(9), 1);
}

TEST(ParallelTasks, EveryTaskOnceWithTheCallersMinimumRows) {
  ThreadsGuard guard(2);
  constexpr int64_t kTasks = 37;
  set_matmul_min_rows(23);
  std::vector<std::atomic<int>> runs(kTasks);
  std::vector<int64_t> seen_rows(kTasks, -1);
  std::vector<int> seen_thread(kTasks, -1);
  for_each_task(kTasks, [&](int64_t task, int thread) {
    runs[static_cast<size_t>(task)]++;
    seen_rows[static_cast<size_t>(task)] = matmul_min_rows();
    seen_thread[static_cast<size_t>(task)] = thread;
  });
  for (int64_t t = 0; t < kTasks; ++t) {
    EXPECT_EQ(runs[static_cast<size_t>(t)].load(), 1) << "task " << t;
    EXPECT_EQ(seen_rows[static_cast<size_t>(t)], 23) << "task " << t;
    EXPECT_GE(seen_thread[static_cast<size_t>(t)], 0) << "task " << t;
    EXPECT_LT(seen_thread[static_cast<size_t>(t)], task_threads(kTasks)) << "task " << t;
  }
  EXPECT_EQ(matmul_min_rows(), 23);
  // The OpenMP workers got their own setting back: a region without a minimum sees none.
  set_matmul_min_rows(0);
  std::vector<int64_t> after(kTasks, -1);
  for_each_task(kTasks, [&](int64_t task, int) { after[static_cast<size_t>(task)] = matmul_min_rows(); });
  for (int64_t t = 0; t < kTasks; ++t) EXPECT_EQ(after[static_cast<size_t>(t)], 0) << "task " << t;
}

// A task's products run on one thread whenever it shares the threads with others, and with batch invariance
// on also when it is alone: otherwise a lone expert's bits would depend on the batch having made one task.
TEST(ParallelTasks, ALoneTaskRunsOnOneThreadOnlyUnderBatchInvariance) {
  ThreadsGuard guard(2);
  int seen = 0;
  for_each_task(1, [&](int64_t, int) { seen = compute_threads(); });
  EXPECT_EQ(seen, 2);
  set_matmul_min_rows(batch_invariant_rows());
  for_each_task(1, [&](int64_t, int) { seen = compute_threads(); });
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(compute_threads(), 2);  // given back
  // Spread over workers, a product runs on one thread because the region is active (oneDNN does not nest).
  std::vector<int> one_thread(4, 0);
  for_each_task(4, [&](int64_t task, int) {
    one_thread[static_cast<size_t>(task)] = compute_threads() == 1 || omp_in_parallel();
  });
  EXPECT_EQ(one_thread, std::vector<int>(4, 1));
}

TEST(ParallelTasks, AnExceptionReachesTheCallerAfterTheOtherTasks) {
  for (int threads : {1, 2}) {
    ThreadsGuard guard(threads);
    std::atomic<int> ran{0};
    EXPECT_THROW(for_each_task(8,
                               [&](int64_t task, int) {
                                 ran++;
                                 if (task == 3) throw std::runtime_error("task 3");
                               }),
                 std::runtime_error);
    // One worker stops at the throw (a plain loop); spread over workers, the others still run.
    EXPECT_EQ(ran.load(), threads == 1 ? 4 : 8) << threads << " threads";
  }
}

}  // namespace
}  // namespace expar
