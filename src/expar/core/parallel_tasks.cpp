#include "expar/core/parallel_tasks.hpp"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <mutex>

#include "expar/core/matmul.hpp"

namespace expar {

int task_threads(int64_t tasks) {
  return static_cast<int>(std::clamp<int64_t>(tasks, 1, compute_threads()));
}

void for_each_task(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn) {
  const int threads = task_threads(tasks);
  if (threads <= 1) {
    for (int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
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
