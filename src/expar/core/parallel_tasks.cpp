#include "expar/core/parallel_tasks.hpp"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>

#include "expar/core/matmul.hpp"

namespace expar {

int task_threads(int64_t tasks) {
  return static_cast<int>(std::clamp<int64_t>(tasks, 1, compute_threads()));
}

namespace {

// Products on one thread for the scope (omp_set_num_threads is per thread), as a worker's are.
struct OneComputeThread {
  int saved = compute_threads();
  OneComputeThread() { set_compute_threads(1); }
  ~OneComputeThread() { set_compute_threads(saved); }
};

#if defined(__SANITIZE_THREAD__)
// The tasks in order on the calling thread, every one run and the first exception rethrown after them: what
// the region does, for the builds that cannot use it.
void run_in_order(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn) {
  std::exception_ptr error;
  for (int64_t t = 0; t < tasks; ++t) {
    try {
      fn(t, 0);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}
#endif

}  // namespace

void for_each_task(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn) {
  const int threads = task_threads(tasks);
  // Batch invariance (matmul_min_rows > 0, expert serve): whether a task's products run on one thread or on
  // all must not depend on how many tasks the batch makes (a lone expert, a lone head), so with several
  // compute threads every task's products run on one thread, alone or not.
  const bool invariant = compute_threads() > 1 && matmul_min_rows() > 0;
  if (threads <= 1) {  // at most one task when compute threads > 1
    std::optional<OneComputeThread> one;
    if (invariant) one.emplace();
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot see libgomp's barriers (libgomp is not instrumented), so every write after a
  // region would read as a race with its workers. Under TSan the tasks run in order on the caller, each with
  // one-thread products as a worker's: the same bits, the same exception behaviour.
  {
    OneComputeThread one;
    run_in_order(tasks, fn);
    return;
  }
#endif
  // The workers take the caller's batch-invariance setting (it is per thread), and an exception may not
  // leave an OpenMP region: the first is kept and rethrown here.
  const int64_t min_rows = matmul_min_rows();
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(threads)
  {
    const int64_t saved = matmul_min_rows();
    set_matmul_min_rows(min_rows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      try {
        fn(t, omp_get_thread_num());
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
    set_matmul_min_rows(saved);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace expar
