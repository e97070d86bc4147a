#include "expar/core/host_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"

namespace expar {
namespace {

TEST(HostSizeClass, HoldsTheRequestWithAtMostAQuarterSlack) {
  size_t previous = 0;
  for (size_t bytes = 1; bytes < (size_t{1} << 31); bytes = bytes * 9 / 8 + 1) {
    const size_t cls = host_size_class(bytes);
    EXPECT_GE(cls, bytes);
    EXPECT_EQ(cls % 64, 0u) << bytes;
    EXPECT_GE(cls, previous) << "classes must not shrink as requests grow: " << bytes;
    previous = cls;
    if (bytes >= kCacheMinBytes) {
      EXPECT_EQ(cls % 4096, 0u) << bytes;
      EXPECT_LE(static_cast<double>(cls), 1.25 * static_cast<double>(bytes) + 4096.0) << bytes;
    }
  }
  // Hand-computed classes: 2^20 + 1 bytes -> 1.25 MiB; 3 MiB - 1 -> 3 MiB; 2^20 exactly -> 2^20.
  EXPECT_EQ(host_size_class((size_t{1} << 20) + 1), (size_t{5} << 18));
  EXPECT_EQ(host_size_class((size_t{3} << 20) - 1), (size_t{3} << 20));
  EXPECT_EQ(host_size_class(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(host_size_class(0), 64u);
  EXPECT_EQ(host_size_class(65), 128u);
}

TEST(HostCache, AFreedLargeBlockIsReusedForTheSameClass) {
  if (!host_cache_stats().enabled) GTEST_SKIP() << "host cache off (sanitizer build or EXPAR_HOST_CACHE=0)";
  host_cache_release();
  const size_t bytes = size_t{3} << 20;
  void* a = host_alloc(bytes);
  std::memset(a, 1, bytes);
  host_free(a, bytes);
  const HostCacheStats after_free = host_cache_stats();
  EXPECT_EQ(after_free.cached_bytes, static_cast<int64_t>(host_size_class(bytes)));
  // A slightly smaller request of the same class gets the very block back.
  void* b = host_alloc(bytes - 1000);
  EXPECT_EQ(b, a);
  const HostCacheStats after_reuse = host_cache_stats();
  EXPECT_EQ(after_reuse.hits, after_free.hits + 1);
  EXPECT_EQ(after_reuse.cached_bytes, 0);
  // Another class does not take it.
  host_free(b, bytes - 1000);
  void* c = host_alloc(size_t{8} << 20);
  EXPECT_NE(c, a);
  host_free(c, size_t{8} << 20);
  host_cache_release();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

// The transparent-huge-page mode of this kernel ("always", "madvise", "never"), or "" where it has none.
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "";
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos ? ""
                                                                 : line.substr(open + 1, close - open - 1);
}

// The flags (smaps "VmFlags", e.g. "hg" for MADV_HUGEPAGE) of the mapping that holds address p.
std::string mapping_flags(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = begin <= address && address < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HostAlloc, LargeBlocksAreHugePageAlignedAndMarkedForHugePages) {
  void* large = host_alloc(kHugePageMinBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % kHugePageBytes, 0u);
  const std::string mode = thp_mode();
  if (mode == "always" || mode == "madvise") {
    const std::string flags = mapping_flags(large);
    ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the block";
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "not marked MADV_HUGEPAGE: " << flags;
  }
  host_free(large, kHugePageMinBytes);
  host_cache_release();
  if (mode != "always" && mode != "madvise")
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' here: only the alignment was checked";
}

TEST(HostCache, TensorAccountingIsUnchangedByTheCache) {
  MemoryTracker tracker;
  TrackerBinding bind(tracker);
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::F32, MemCategory::Activations);
    EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), 4 << 20);
  }
  // Freed (into the cache or not): the tensor's category no longer counts it.
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), 0);
  EXPECT_EQ(tracker.snapshot().peak_of(MemCategory::Activations), 4 << 20);
}

}  // namespace
}  // namespace expar
