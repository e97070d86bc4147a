#include "expar/core/host_allocator.hpp"

#include <sys/mman.h>

#include <bit>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/core/memory.hpp"

namespace expar {

namespace {

constexpr size_t kPage = 4096;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

struct Cache {
  std::mutex mutex;
  bool enabled = false;
  int64_t limit = 0;
  int64_t cached = 0;
  int64_t hits = 0;
  int64_t misses = 0;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks

  Cache() {
    const char* on = std::getenv("EXPAR_HOST_CACHE");
    enabled = on != nullptr ? std::string(on) != "0" : !kSanitized;
    int64_t mb = 8192;
    if (const char* env = std::getenv("EXPAR_HOST_CACHE_MB")) {
      char* end = nullptr;
      const long long v = std::strtoll(env, &end, 10);
      EXPAR_CHECK(end != env && *end == '\0' && v >= 0,
                  "EXPAR_HOST_CACHE_MB='{}': must be a whole number of MiB >= 0 (0 keeps nothing)", env);
      mb = v;
    }
    limit = mb << 20;
  }
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may be freed during static destruction
  return *c;
}

void* system_alloc(size_t bytes) {
  const bool huge = bytes >= kHugePageMinBytes;
  // aligned_alloc wants a size that is a multiple of the alignment; the rounding is never touched.
  const size_t size = huge ? (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes : bytes;
  void* p = std::aligned_alloc(huge ? kHugePageBytes : 64, size);
  EXPAR_CHECK(p != nullptr, "host allocation of {} failed: reduce the sizes (batch, model) or the ranks",
              format_bytes(static_cast<int64_t>(bytes)));
  // A hint: where transparent huge pages are off ("never") or absent the block keeps 4 KiB pages, so the
  // result is not checked.
  if (huge) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

}  // namespace

size_t host_size_class(size_t bytes) {
  if (bytes < kCacheMinBytes) return bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  // 2^k <= bytes < 2^(k+1); classes 2^k + j·2^(k-2), j = 0..4.
  const size_t octave = std::bit_floor(bytes);
  const size_t step = octave / 4;
  size_t cls = (bytes + step - 1) / step * step;
  return (cls + kPage - 1) / kPage * kPage;
}

void* host_alloc(size_t bytes) {
  const size_t cls = host_size_class(bytes);
  Cache& c = cache();
  if (cls < kCacheMinBytes || !c.enabled) return system_alloc(cls);
  {
    std::lock_guard lock(c.mutex);
    auto it = c.free_blocks.find(cls);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= static_cast<int64_t>(cls);
      ++c.hits;
      return p;
    }
    ++c.misses;
  }
  return system_alloc(cls);
}

void host_free(void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t cls = host_size_class(bytes);
  Cache& c = cache();
  if (cls >= kCacheMinBytes && c.enabled) {
    std::lock_guard lock(c.mutex);
    if (c.cached + static_cast<int64_t>(cls) <= c.limit) {
      c.free_blocks[cls].push_back(p);
      c.cached += static_cast<int64_t>(cls);
      return;
    }
  }
  std::free(p);
}

HostCacheStats host_cache_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return HostCacheStats{c.enabled, c.cached, c.limit, c.hits, c.misses};
}

void host_cache_release() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [cls, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.cached = 0;
}

}  // namespace expar
