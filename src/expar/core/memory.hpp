#pragma once
// Per-rank memory accounting. Every large allocation carries a category; a MemoryTracker keeps current and
// peak bytes per category. Each rank has its own tracker; the launcher of a rank binds it to the rank's
// thread (bind_tracker), and allocations record against the tracker bound when they were made, so a
// buffer freed on another thread is still credited to its owner.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace expar {

enum class MemCategory : uint8_t {
  DenseWeights,
  ExpertWeights,
  MappedWeights,  // weights used in place from a mapped checkpoint file (file pages, no heap copy)
  Gradients,
  OptimizerState,
  Activations,
  KvCache,  // inference: keys and values of every sequence's past positions
  SymmetricBuffers,
  CommScratch,
  Other,
};
constexpr size_t kNumMemCategories = 10;
std::string_view mem_category_name(MemCategory category);

struct MemorySnapshot {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
  int64_t current_of(MemCategory c) const { return current[static_cast<size_t>(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[static_cast<size_t>(c)]; }
};

class MemoryTracker {
 public:
  void add(MemCategory category, int64_t bytes);
  void sub(MemCategory category, int64_t bytes);
  MemorySnapshot snapshot() const;
  void reset_peaks();

 private:
  std::array<std::atomic<int64_t>, kNumMemCategories> current_{};
  std::array<std::atomic<int64_t>, kNumMemCategories> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
};

// The tracker of the calling thread's rank (a process-wide default when none is bound).
MemoryTracker& current_tracker();
// Binds `tracker` to the calling thread for the lifetime of the guard.
class TrackerBinding {
 public:
  explicit TrackerBinding(MemoryTracker& tracker);
  ~TrackerBinding();
  TrackerBinding(const TrackerBinding&) = delete;
  TrackerBinding& operator=(const TrackerBinding&) = delete;

 private:
  MemoryTracker* previous_;
};

// Human-readable table of a snapshot ("category  current  peak"), one line per non-empty category.
std::string format_memory(const MemorySnapshot& snapshot);
// Drops this process's resident pages wholly inside [p, p + bytes) of a read-only private file mapping
// (madvise MADV_DONTNEED; a later access maps them from the file again). Whole pages only: a page shared
// with a neighbouring tensor stays. Only for mapped file bytes that were never written.
void release_file_pages(const void* p, size_t bytes);
// This process's peak resident set so far (getrusage ru_maxrss), in bytes.
int64_t peak_resident_bytes();
std::string format_bytes(int64_t bytes);
// The memory this process could still take without the machine swapping or killing it: /proc/meminfo's
// MemAvailable, or less where a cgroup (v2: memory.max less memory.current) limits it. 0 when neither can be
// read.
int64_t available_host_memory_bytes();

}  // namespace expar
