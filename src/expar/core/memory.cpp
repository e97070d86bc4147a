#include "expar/core/memory.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

namespace expar {

std::string_view mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::DenseWeights:
      return "dense weights";
    case MemCategory::ExpertWeights:
      return "expert weights";
    case MemCategory::MappedWeights:
      return "weights (mapped file)";
    case MemCategory::Gradients:
      return "gradients";
    case MemCategory::OptimizerState:
      return "optimizer state";
    case MemCategory::Activations:
      return "activations";
    case MemCategory::KvCache:
      return "KV cache";
    case MemCategory::SymmetricBuffers:
      return "symmetric buffers";
    case MemCategory::CommScratch:
      return "communication scratch";
    case MemCategory::Other:
      return "other";
  }
  return "?";
}

namespace {
void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void MemoryTracker::add(MemCategory category, int64_t bytes) {
  auto i = static_cast<size_t>(category);
  raise_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryTracker::sub(MemCategory category, int64_t bytes) {
  current_[static_cast<size_t>(category)].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

MemorySnapshot MemoryTracker::snapshot() const {
  MemorySnapshot s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    s.current[i] = current_[i].load(std::memory_order_relaxed);
    s.peak[i] = peak_[i].load(std::memory_order_relaxed);
  }
  s.total_current = total_current_.load(std::memory_order_relaxed);
  s.total_peak = total_peak_.load(std::memory_order_relaxed);
  return s;
}

void MemoryTracker::reset_peaks() {
  for (size_t i = 0; i < kNumMemCategories; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_current_.load());
}

namespace {
MemoryTracker& default_tracker() {
  static MemoryTracker tracker;
  return tracker;
}
thread_local MemoryTracker* bound_tracker = nullptr;
}  // namespace

MemoryTracker& current_tracker() {
  return bound_tracker ? *bound_tracker : default_tracker();
}

TrackerBinding::TrackerBinding(MemoryTracker& tracker) : previous_(bound_tracker) {
  bound_tracker = &tracker;
}
TrackerBinding::~TrackerBinding() {
  bound_tracker = previous_;
}

std::string format_bytes(int64_t bytes) {
  double b = static_cast<double>(bytes);
  if (b >= 0x1p40) return fmt::format("{:.2f} TiB", b / 0x1p40);
  if (b >= 0x1p30) return fmt::format("{:.2f} GiB", b / 0x1p30);
  if (b >= 0x1p20) return fmt::format("{:.2f} MiB", b / 0x1p20);
  if (b >= 0x1p10) return fmt::format("{:.2f} KiB", b / 0x1p10);
  return fmt::format("{} B", bytes);
}

namespace {

// The number a one-line file holds ("max" and unreadable files: nullopt).
std::optional<int64_t> read_count(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

int64_t available_host_memory_bytes() {
  int64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  const auto limit = read_count("/sys/fs/cgroup/memory.max");
  const auto used = read_count("/sys/fs/cgroup/memory.current");
  if (limit && used) {
    const int64_t left = std::max<int64_t>(0, *limit - *used);
    available = available > 0 ? std::min(available, left) : left;
  }
  return available;
}

void release_file_pages(const void* p, size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

int64_t peak_resident_bytes() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string format_memory(const MemorySnapshot& s) {
  std::string out = fmt::format("{:<24}{:>14}{:>14}\n", "category", "current", "peak");
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    if (s.current[i] == 0 && s.peak[i] == 0) continue;
    out += fmt::format("{:<24}{:>14}{:>14}\n", mem_category_name(static_cast<MemCategory>(i)),
                       format_bytes(s.current[i]), format_bytes(s.peak[i]));
  }
  out +=
      fmt::format("{:<24}{:>14}{:>14}\n", "total", format_bytes(s.total_current), format_bytes(s.total_peak));
  return out;
}

}  // namespace expar
