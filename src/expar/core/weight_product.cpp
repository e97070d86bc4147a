#include "expar/core/weight_product.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "expar/core/assert.hpp"
#include "expar/core/matmul.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EXPAR_WEIGHT_PRODUCT_FUSED 1
#else
#define EXPAR_WEIGHT_PRODUCT_FUSED 0
#endif

namespace expar {
namespace {

#if EXPAR_WEIGHT_PRODUCT_FUSED

// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps(), which -Wuninitialized flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 16 registers: a 6 x 2 tile of accumulators, the panel's two vectors at k and a broadcast of x.
struct Avx2 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int kRows = 6;
  static V zero() { return _mm256_setzero_ps(); }
  static V splat(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // dst[c][r] = src[r][c] for an 8 x 8 block.
  static void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
    V r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = load(src + i * lds);
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Per 128-bit lane L, s[4g + c] holds column 4L + c of rows 4g..4g+3.
    V s[8];
    for (int g = 0; g < 2; ++g) {
      s[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      store(dst + c * ldd, _mm256_permute2f128_ps(s[c], s[4 + c], 0x20));
      store(dst + (4 + c) * ldd, _mm256_permute2f128_ps(s[c], s[4 + c], 0x31));
    }
  }
};

#if defined(__AVX512F__)
// 32 registers: a 12 x 2 tile of accumulators, the panel's two vectors at k and a broadcast of x (12 x 2 ran
// fastest of 10-14 x 2, 6 x 4 and 8 x 3 in the register-tiled probes of docs/performance.md).
struct Avx512 {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int kRows = 12;
  static V zero() { return _mm512_setzero_ps(); }
  static V splat(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // dst[c][r] = src[r][c] for a 16 x 16 block.
  static void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
    V r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = load(src + i * lds);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Per 128-bit lane L, r[4g + c] holds column 4L + c of rows 4g..4g+3.
    for (int g = 0; g < 4; ++g) {
      r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    // Gather each column's four 128-bit lanes (rows 0-3, 4-7, 8-11, 12-15).
    for (int c = 0; c < 4; ++c) {
      const V even_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), odd_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
      const V even_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88),
              odd_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
      store(dst + c * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
      store(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(even_lo, even_hi, 0xdd));
      store(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
      store(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xdd));
    }
  }
};
using Native = Avx512;
#else
using Native = Avx2;
#endif

// A panel is at most this many values of k: 64 KiB packed on AVX-512 (32 rows), which stays in L2 beside the
// tiles' rows of x. Longer products run block after block of k, each element's chain carried through y.
constexpr int64_t kBlockK = 512;
// The k steps between two bursts of prefetches (one cache line of x per row of the tile).
constexpr int64_t kPrefetchStep = 16;
// Below this many multiply-adds a product stays on the calling thread.
constexpr int64_t kParallelMin = int64_t{1} << 22;

// Fetches the rows of the next panel block into L2 while the current one is multiplied: `rows` runs of
// `floats` floats, `stride_floats` apart, one cache line per prefetch, in order.
class NextBlockFetch {
 public:
  NextBlockFetch() = default;
  NextBlockFetch(const float* first, int64_t stride_floats, int64_t rows, int64_t floats)
      : first_(first), stride_(stride_floats), rows_(rows), floats_(floats) {
    start_row();
  }
  // At most this many lines are left to fetch (a run touches one more line than its length where it
  // straddles a boundary).
  int64_t lines() const { return rows_ * (floats_ * static_cast<int64_t>(sizeof(float)) / 64 + 2); }
  void issue(int64_t count) {
    for (; count > 0 && row_ < rows_; --count) {
      _mm_prefetch(line_, _MM_HINT_T1);
      line_ += 64;
      if (line_ > row_last_) ++row_, start_row();
    }
  }

 private:
  // line_ and row_last_: the first and last cache line of run row_.
  void start_row() {
    if (row_ >= rows_) return;
    const auto begin = reinterpret_cast<uintptr_t>(first_ + row_ * stride_);
    const uintptr_t end = begin + static_cast<uintptr_t>(floats_) * sizeof(float) - 1;
    line_ = reinterpret_cast<const char*>(begin & ~uintptr_t{63});
    row_last_ = reinterpret_cast<const char*>(end & ~uintptr_t{63});
  }
  const float* first_ = nullptr;
  int64_t stride_ = 0, rows_ = 0, floats_ = 0, row_ = 0;
  const char* line_ = nullptr;
  const char* row_last_ = nullptr;
};

// One block of a panel: the panel's rows [j, j + rows) of w (rows <= 2 lanes) and kc values of k from `w`,
// packed as P[kk][2 * kLanes] with P[kk][r] = w[r][kk] (zero for r >= rows).
template <class S>
void pack(const float* w, int64_t ldw, int64_t rows, int64_t kc, float* packed) {
  constexpr int64_t kLanes = S::kLanes, kWidth = 2 * kLanes;
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t r0 = half * kLanes, valid = std::clamp<int64_t>(rows - r0, 0, kLanes);
    int64_t kk = 0;
    if (valid == kLanes)
      for (; kk + kLanes <= kc; kk += kLanes)
        S::transpose_block(w + r0 * ldw + kk, ldw, packed + kk * kWidth + r0, kWidth);
    for (; kk < kc; ++kk)
      for (int64_t r = 0; r < kLanes; ++r) packed[kk * kWidth + r0 + r] = r < valid ? w[(r0 + r) * ldw + kk] : 0.0f;
  }
}

// y[i][0, cols) (+)= x[i][0, kc) · the packed block, i < R: the chain of each element starts at 0 for the
// first block of k and continues from y otherwise. cols < 2 lanes only in the last panel of a ragged n.
template <class S, int R>
void tile(const float* x, int64_t ldx, const float* packed, int64_t kc, float* y, int64_t ldy, int64_t cols,
          bool first_block, NextBlockFetch& fetch, int64_t fetch_per_step) {
  using V = typename S::V;
  constexpr int64_t kLanes = S::kLanes, kWidth = 2 * kLanes;
  const bool whole = cols == kWidth;
  alignas(64) float edge[R][kWidth];  // a ragged panel's columns, through memory
  V acc[R][2];
  for (int i = 0; i < R; ++i) {
    if (first_block) {
      acc[i][0] = acc[i][1] = S::zero();
      continue;
    }
    const float* from = y + i * ldy;
    if (!whole) {
      std::fill(edge[i], edge[i] + kWidth, 0.0f);
      std::copy(from, from + cols, edge[i]);
      from = edge[i];
    }
    acc[i][0] = S::load(from);
    acc[i][1] = S::load(from + kLanes);
  }
  for (int64_t k0 = 0; k0 < kc; k0 += kPrefetchStep) {
    fetch.issue(fetch_per_step);
    const int64_t k_end = std::min(kc, k0 + kPrefetchStep);
    for (int64_t kk = k0; kk < k_end; ++kk) {
      const V b0 = S::load(packed + kk * kWidth), b1 = S::load(packed + kk * kWidth + kLanes);
      for (int i = 0; i < R; ++i) {
        const V a = S::splat(x + i * ldx + kk);
        acc[i][0] = S::fma(a, b0, acc[i][0]);
        acc[i][1] = S::fma(a, b1, acc[i][1]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    float* to = whole ? y + i * ldy : edge[i];
    S::store(to, acc[i][0]);
    S::store(to + kLanes, acc[i][1]);
    if (!whole) std::copy(edge[i], edge[i] + cols, y + i * ldy);
  }
}

// The last rows of x (fewer than a tile): the tile of exactly that many rows.
template <class S, int R>
void tail_tile(int rows, const float* x, int64_t ldx, const float* packed, int64_t kc, float* y, int64_t ldy,
               int64_t cols, bool first_block, NextBlockFetch& fetch, int64_t fetch_per_step) {
  if constexpr (R > 0) {
    if (rows == R) return tile<S, R>(x, ldx, packed, kc, y, ldy, cols, first_block, fetch, fetch_per_step);
    tail_tile<S, R - 1>(rows, x, ldx, packed, kc, y, ldy, cols, first_block, fetch, fetch_per_step);
  }
}

// The packing buffer of the calling thread: one panel block, 64-byte aligned.
float* packing_buffer(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(floats + 16)) buffer.resize(static_cast<size_t>(floats + 16));
  const auto address = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - address % 64) % 64) / sizeof(float);
}

// Panels [first, last) of the product on the calling thread, block after block of k; while a block is
// multiplied, the next one's rows of w are fetched.
template <class S>
void panels(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t m,
            int64_t n, int64_t k, int64_t first, int64_t last) {
  constexpr int64_t kWidth = 2 * S::kLanes;
  constexpr int kRows = S::kRows;
  float* packed = packing_buffer(kWidth * kBlockK);
  const int64_t k_blocks = (k + kBlockK - 1) / kBlockK, tiles = (m + kRows - 1) / kRows;
  for (int64_t p = first; p < last; ++p) {
    const int64_t j = p * kWidth, cols = std::min(kWidth, n - j);
    for (int64_t b = 0; b < k_blocks; ++b) {
      const int64_t k0 = b * kBlockK, kc = std::min(kBlockK, k - k0);
      pack<S>(w + j * ldw + k0, ldw, cols, kc, packed);
      // The next block: the next of k in this panel, else the first of the next panel (if this thread's).
      NextBlockFetch fetch;
      if (b + 1 < k_blocks)
        fetch = NextBlockFetch(w + j * ldw + k0 + kBlockK, ldw, cols, std::min(kBlockK, k - k0 - kBlockK));
      else if (p + 1 < last)
        fetch = NextBlockFetch(w + (j + kWidth) * ldw, ldw, std::min(kWidth, n - j - kWidth), std::min(kBlockK, k));
      const int64_t steps = tiles * ((kc + kPrefetchStep - 1) / kPrefetchStep);
      const int64_t per_step = (fetch.lines() + steps - 1) / steps;
      for (int64_t i = 0; i < m; i += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
        if (rows == kRows)
          tile<S, kRows>(x + i * ldx + k0, ldx, packed, kc, y + i * ldy + j, ldy, cols, b == 0, fetch, per_step);
        else
          tail_tile<S, kRows - 1>(rows, x + i * ldx + k0, ldx, packed, kc, y + i * ldy + j, ldy, cols, b == 0,
                                  fetch, per_step);
      }
    }
  }
}

template <class S>
void product(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t m, int64_t n,
             int64_t k) {
  constexpr int64_t kWidth = 2 * S::kLanes;
  const int64_t panel_count = (n + kWidth - 1) / kWidth;
  if (m * n * k < kParallelMin || panel_count < 2 || omp_in_parallel() || omp_get_max_threads() == 1) {
    panels<S>(x, ldx, w, ldw, y, ldy, m, n, k, 0, panel_count);
    return;
  }
  // Contiguous runs of panels, one per thread, so that each fetches its own next panel.
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), panel_count));
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    panels<S>(x, ldx, w, ldw, y, ldy, m, n, k, panel_count * t / threads, panel_count * (t + 1) / threads);
  }
}

#pragma GCC diagnostic pop

#endif  // EXPAR_WEIGHT_PRODUCT_FUSED

void check_shape(int64_t ldx, int64_t ldw, int64_t ldy, int64_t m, int64_t n, int64_t k) {
  EXPAR_ASSERT(m >= 0 && n >= 0 && k >= 0 && ldx >= k && ldw >= k && ldy >= n,
               "weight_product of x [{}, {}] (stride {}) by w [{}, {}]ᵀ (stride {}) into stride {}", m, k, ldx, n, k,
               ldw, ldy);
}

// Edge cases every kernel shares: nothing to compute, or an empty sum (y = 0).
bool trivial(float* y, int64_t ldy, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return true;
  if (k > 0) return false;
  for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
  return true;
}

}  // namespace

void weight_product(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t m,
                    int64_t n, int64_t k) {
  check_shape(ldx, ldw, ldy, m, n, k);
  if (trivial(y, ldy, m, n, k)) return;
#if EXPAR_WEIGHT_PRODUCT_FUSED
  product<Native>(x, ldx, w, ldw, y, ldy, m, n, k);
#else
  MatmulArgs args{x, w, y, m, n, k, false, true, false};
  args.lda = ldx;
  args.ldb = ldw;
  args.ldc = ldy;
  matmul(args);
#endif
}

bool weight_product_fused() {
  return EXPAR_WEIGHT_PRODUCT_FUSED != 0;
}

void weight_product_avx2_for_tests(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                                   int64_t ldy, int64_t m, int64_t n, int64_t k) {
#if EXPAR_WEIGHT_PRODUCT_FUSED
  check_shape(ldx, ldw, ldy, m, n, k);
  if (trivial(y, ldy, m, n, k)) return;
  product<Avx2>(x, ldx, w, ldw, y, ldy, m, n, k);
#else
  weight_product(x, ldx, w, ldw, y, ldy, m, n, k);
#endif
}

}  // namespace expar
