#pragma once
// Host memory for tensors, with a cache of freed large blocks (the CPU analogue of a GPU caching allocator).
//
// Why: the first touch of a fresh page is expensive, and on virtual machines whose host backs guest memory
// lazily it costs far more than writing the same page once it is touched (a page fault that the host
// services, against a store to memory; docs/performance_history.md, "Fresh pages"). glibc serves every block
// above its mmap threshold (at most 32 MiB) with a fresh mmap and returns it with munmap on free, so each
// training step paid that price again for every large activation, gradient and dispatch buffer: it was most
// of the grouped-GEMM phase's overhead and most of the permute/dispatch time.
//
// Policy: blocks of at least kCacheMinBytes are rounded up to a size class (4 classes per octave, so at most
// 25% slack, in whole pages) and, when freed, kept in a per-class free list instead of being unmapped; the
// next request of the same class reuses one. The slack is never touched, so it costs address space, not
// memory. The cache holds at most `limit` freed bytes (EXPAR_HOST_CACHE_MB, default 8192); past that a freed
// block goes back to the system. EXPAR_HOST_CACHE=0 turns the cache off; sanitizer builds turn it off by
// default so that AddressSanitizer still sees every use after free.
//
// Blocks of at least kHugePageMinBytes (the expert weights and the copied dense weights of inference, any
// other tensor this large) start on a 2 MiB boundary and are marked for transparent huge pages (madvise
// MADV_HUGEPAGE: where the kernel's THP mode is "madvise", as on the Zen 5 development VM, a block without
// the mark gets 4 KiB pages). Why: batch-1 decode streams every weight once per token, and a stream over
// 4 KiB pages pays a TLB miss every page; with the expert weights in huge pages decode was faster in every
// alternated round (docs/performance_history.md, "Huge pages and m = 1 products dealt in chunks"). The last
// huge page of a block may be touched only in part: at most 2 MiB more resident memory per block, hence the
// 8 MiB floor.
//
// Thread-safe (one mutex; allocations this large are rare enough that it is never contended).
#include <cstddef>
#include <cstdint>

namespace expar {

inline constexpr size_t kCacheMinBytes = size_t{256} << 10;
inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr size_t kHugePageMinBytes = size_t{8} << 20;

// 64-byte aligned (2 MiB from kHugePageMinBytes on); never null (throws expar::Error naming the size). bytes
// == 0 gives a valid 64-byte block.
void* host_alloc(size_t bytes);
// `bytes` must be the size passed to host_alloc for `p`.
void host_free(void* p, size_t bytes);

struct HostCacheStats {
  bool enabled = false;
  int64_t cached_bytes = 0;  // freed bytes kept for reuse (size-class bytes)
  int64_t limit_bytes = 0;
  int64_t hits = 0;    // large requests served from the cache
  int64_t misses = 0;  // large requests that went to the system
};
HostCacheStats host_cache_stats();

// Gives every cached block back to the system (blocks in use are unaffected).
void host_cache_release();

// Size class of a large request: the smallest of 2^k·{1, 1.25, 1.5, 1.75} (rounded up to 4 KiB) that holds
// `bytes`. Requests below kCacheMinBytes are returned rounded up to 64 bytes. Exposed for tests.
size_t host_size_class(size_t bytes);

}  // namespace expar
