#pragma once
// Independent tasks (attention heads, experts) spread over the calling thread's compute threads, one task per
// thread at a time, instead of every task's small products being split over all of them: a lone small sgemm
// reaches only part of a big one's rate, and what runs between the products (softmax, SwiGLU) ran on one
// thread. Inside the region every oneDNN product runs on its worker alone (no nested parallelism), so a
// task computes exactly what it computes at one compute thread: results never depend on the thread count.
#include <cstdint>
#include <functional>

namespace expar {

// The number of workers for_each_task uses for `tasks` tasks: min(compute threads, tasks), at least 1
// (the row count of per-worker scratch).
int task_threads(int64_t tasks);

// fn(task, thread) for task in [0, tasks), handed out in order, one at a time, to whichever worker is free
// (thread in [0, task_threads(tasks))): order the tasks longest first for the best balance. With one worker,
// a plain loop on the calling thread. The workers take the caller's batch-invariance setting
// (matmul_min_rows, which is per thread). Spread over workers, the first exception a task throws is
// rethrown here after the region (the other tasks still run); the plain loop stops at it. With batch
// invariance on (matmul_min_rows > 0) and several compute threads, a lone task's products also run on one
// thread, so a result never depends on how many tasks its batch made. Under ThreadSanitizer the tasks run
// in order on the caller with one-thread products (TSan cannot see libgomp's barriers).
void for_each_task(int64_t tasks, const std::function<void(int64_t task, int thread)>& fn);

}  // namespace expar
