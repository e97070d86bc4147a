#include "expar/comm/mpi/mpi_util.hpp"

#include <sched.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "expar/core/error.hpp"

namespace expar::mpi {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail("{}: MPI error: {}", what, std::string(text, static_cast<size_t>(length)));
}

int to_int(size_t bytes, const char* op) {
  EXPAR_CHECK(bytes <= static_cast<size_t>(INT_MAX),
              "{}: {} bytes exceed MPI's int count limit ({}); split the transfer into smaller pieces", op,
              bytes, INT_MAX);
  return static_cast<int>(bytes);
}

void wait(MPI_Request& request, const char* op, const std::string& group, double timeout_seconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_seconds);
  // Waits longer than this are a peer that is idle, not late (a server's followers between requests):
  // poll once a millisecond instead of spinning a core.
  const auto patient = start + std::chrono::milliseconds(50);
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), op);
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline)
      fail(
          "{} on group '{}' timed out after {} s: some members did not arrive (MPI cannot tell which; their "
          "own "
          "messages say where they are); raise EXPAR_COMM_TIMEOUT if they are just slow",
          op, group, timeout_seconds);
    if (std::chrono::steady_clock::now() > patient)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else
      sched_yield();  // ranks may outnumber cores
  }
}

bool active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

namespace {

// One watchdog thread per process, started on first use; it sleeps until the earliest registered deadline.
class Watchdog {
 public:
  static Watchdog& instance() {
    static Watchdog* w = new Watchdog();  // never destroyed: it may be needed until the process ends
    return *w;
  }
  uint64_t add(std::string message, double timeout_seconds) {
    std::lock_guard lock(mutex_);
    const uint64_t id = next_++;
    const auto limit = std::chrono::duration<double>(std::min(timeout_seconds, 1e9));
    deadlines_.emplace(id, Entry{std::chrono::steady_clock::now() +
                                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(limit),
                                 std::move(message)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    wake_.notify_all();
    return id;
  }
  void remove(uint64_t id) {
    std::lock_guard lock(mutex_);
    deadlines_.erase(id);
  }

 private:
  struct Entry {
    std::chrono::steady_clock::time_point deadline;
    std::string message;
  };
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (deadlines_.empty()) {
        wake_.wait(lock);
        continue;
      }
      auto first = deadlines_.begin();
      for (auto it = deadlines_.begin(); it != deadlines_.end(); ++it)
        if (it->second.deadline < first->second.deadline) first = it;
      if (std::chrono::steady_clock::now() >= first->second.deadline) {
        print_last_words("{}\n", first->second.message);
        std::_Exit(1);
      }
      const auto deadline = first->second.deadline;  // a copy: remove() may erase the entry while we wait
      wake_.wait_until(lock, deadline);
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Entry> deadlines_;
  uint64_t next_ = 0;
  std::thread thread_;
};

}  // namespace

BlockingDeadline::BlockingDeadline(const char* op, const std::string& group, double timeout_seconds) {
  int rank = -1;
  if (active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  id_ = Watchdog::instance().add(
      fmt::format(
          "expar: rank {}: error: {} on group '{}' timed out after {} s: some members did not arrive "
          "(stopped or gone; their own messages say where they are); raise EXPAR_COMM_TIMEOUT if they "
          "are just slow",
          rank, op, group, timeout_seconds),
      timeout_seconds);
}

BlockingDeadline::~BlockingDeadline() {
  Watchdog::instance().remove(id_);
}

bool unwinding() {
  return std::uncaught_exceptions() > 0;
}

}  // namespace expar::mpi
