#include "expar/core/host_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

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
