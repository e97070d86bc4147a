#include "expar/core/matvec.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "expar/core/bf16_round.hpp"
#include "expar/core/product_precision.hpp"
#include "expar/core/weight_lanes.hpp"

namespace expar {
namespace {

using namespace weight_lanes;

// Below this many weights a product stays on the calling thread (the region would cost more than it
// saves).
constexpr int64_t kParallelMin = int64_t{1} << 16;

// Eight rows at a time: several independent chains of fused multiply-adds hide the FMA's latency, which one
// row's single chain cannot. Variants of this loop built into one probe and timed round by round in the same
// process (docs/performance_history.md, "Rows per block, compared in one process"): 6 and 8 rows read faster
// than 4 on average, 12 and 2 rows and one row at a time slower. Probes that alternated separate binaries had
// ranked 4 rows first and, later, one row: on a shared VM a process's moment moves the figures more than the
// loops differ, so variants are compared inside one process. Each row's sum has the same order at any block
// size. Only with AVX-512's 32 registers: under AVX2 each Lanes takes two of 16 registers, so 8 rows' sums
// alone would fill them.
#if defined(__AVX512F__)
constexpr int64_t kRows = 8;
#else
constexpr int64_t kRows = 4;
#endif

// About this many weight bytes per chunk (rounded to whole kRows blocks): the grain at which a thread takes
// work from another's run at the end of a region (a thread's own chunks are contiguous, so they stream as
// one). 32 KiB chunks measured no different in decode (docs/performance_history.md, "Reads in runs").
constexpr int64_t kChunkBytes = int64_t{128} << 10;

// The byte of a row that column i (a multiple of 16) starts at, in format F.
template <WeightFormat F>
constexpr int64_t column_byte(int64_t i) {
  if constexpr (F == WeightFormat::F32) return i * 4;
  if constexpr (F == WeightFormat::BF16 || F == WeightFormat::F16) return i * 2;
  if constexpr (F == WeightFormat::FP8) return i;
  return i / 2;  // MXFP4: two values a byte
}

// While a block reads columns [i, i + 16) of its rows, the same columns of the next block's rows are asked
// for (once per 64-byte line): each row is a short stream of its own that the hardware prefetcher finds
// again from its start, so without this the block's reads wait on memory latency row by row. A prefetch
// never faults (past the product's last row it reads nothing useful and changes nothing) and changes no
// result.
template <WeightFormat F, int64_t R>
inline void prefetch_next_block(const RowPointers (&row)[R], int64_t i, int64_t ahead_bytes) {
  const int64_t byte = column_byte<F>(i);
  if (byte % 64 != 0) return;
  for (int64_t r = 0; r < R; ++r)
    __builtin_prefetch(static_cast<const char*>(row[r].values) + byte + ahead_bytes);
}

// kNanCodes false (FP8 only): w's codes hold no NaN code (WeightView::fp8_nan_free), widened without the NaN
// lanes' handling; every value, sum and order is the same.
template <WeightFormat F, int64_t R, bool kNanCodes = true>
void rows_dot(const float* a, const WeightView& w, int64_t first, float* c, bool accumulate) {
  const int64_t k = w.cols, col0 = w.block_col0;
  RowPointers row[R];
  for (int64_t r = 0; r < R; ++r) row[r] = row_pointers(w, first + r);
  const int64_t ahead_bytes = R * column_byte<F>(w.ld);  // the next block's rows: R row strides on
  Lanes sum[R];
  for (int64_t r = 0; r < R; ++r) sum[r] = Lanes{};
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (F == WeightFormat::MXFP4) {
    // A block of 32 at a time (k is whole blocks): the same sums in the same order as the loop below.
    for (; i < k; i += kMxfp4Block) {
      prefetch_next_block<F, R>(row, i, ahead_bytes);
      Lanes x0, x1;
      std::memcpy(&x0, a + i, sizeof x0);
      std::memcpy(&x1, a + i + kLanes, sizeof x1);
      for (int64_t r = 0; r < R; ++r) {
        Lanes w0, w1;
        widen_e2m1_block(static_cast<const uint8_t*>(row[r].values) + i / 2,
                         e8m0_value(static_cast<const uint8_t*>(row[r].scales)[i / kMxfp4Block]), w0, w1);
        sum[r] += x0 * w0;
        sum[r] += x1 * w1;
      }
    }
  }
  if constexpr (F == WeightFormat::FP8) {
    // Whole 128-column blocks from a block's first column, one multiplier each (times 2^8: the widening's
    // power of two, exact): the same values, sums and order as the loop below, decoded with one conversion.
    if (col0 == 0) {
      for (; i + kFp8Block <= k; i += kFp8Block) {
        Lanes scale[R];
        for (int64_t r = 0; r < R; ++r)
          scale[r] = Lanes{} + static_cast<const float*>(row[r].scales)[i / kFp8Block] * 256.0f;
#if defined(__AVX512BW__)
        // Two lanes' worth of codes at a time; each lane's sum still takes its columns in order.
        for (int64_t b = 0; b < kFp8Block; b += 2 * kLanes) {
          prefetch_next_block<F, R>(row, i + b, ahead_bytes);
          Lanes x0, x1;
          std::memcpy(&x0, a + i + b, sizeof x0);
          std::memcpy(&x1, a + i + b + kLanes, sizeof x1);
          for (int64_t r = 0; r < R; ++r) {
            Lanes w0, w1;
            widen_fp8_pair<kNanCodes>(static_cast<const uint8_t*>(row[r].values) + i + b, scale[r], w0, w1);
            sum[r] += x0 * w0;
            sum[r] += x1 * w1;
          }
        }
#else
        for (int64_t b = 0; b < kFp8Block; b += kLanes) {
          prefetch_next_block<F, R>(row, i + b, ahead_bytes);
          Lanes x;
          std::memcpy(&x, a + i + b, sizeof x);
          for (int64_t r = 0; r < R; ++r) {
            __m512 v;
            widen_e4m3_over_256(static_cast<const uint8_t*>(row[r].values) + i + b, v);
            Lanes w;
            copy_bits(v, w);
            w *= scale[r];
            sum[r] += x * w;
          }
        }
#endif
      }
    }
  }
#endif
  for (; i + kLanes <= k; i += kLanes) {
    prefetch_next_block<F, R>(row, i, ahead_bytes);
    Lanes x;
    std::memcpy(&x, a + i, sizeof x);
    for (int64_t r = 0; r < R; ++r) {
      Lanes w;
      widen<F>(row[r], i, col0, w);
      sum[r] += x * w;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float total = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) total += sum[r][l];
    // One fused multiply-add per element, written out: left to the compiler, the f32 tail was partly
    // vectorised as separate multiplies and adds, so its bits depended on the format's code shape.
    for (int64_t j = i; j < k; ++j) total = std::fma(a[j], element<F>(row[r], j, col0), total);
    c[r] = accumulate ? c[r] + total : total;
  }
}

#if defined(__AVX512BF16__)
// BF16 weights times BF16-rounded activations a16 on the CPU's BF16 dot products (ProductPrecision::BF16):
// each vdpbf16ps multiplies 32 weight pairs by 32 activations as they are stored, without widening, every
// product exact in f32 and added into 16 f32 lanes (lane l takes columns 2l and 2l + 1 of each run of 32);
// then the lanes in order and the tail, as rows_dot. The instruction treats BF16 subnormals as zero and
// flushes subnormal sums, which only values below 2^-126 notice. One thread's fixed sequence per row: the
// same bits at any thread count and in any grouping of products.
template <int64_t R>
void rows_dot_bf16(const uint16_t* a16, const WeightView& w, int64_t first, float* c, bool accumulate) {
  constexpr int64_t kPairs = 2 * kLanes;
  const int64_t k = w.cols;
  const uint16_t* row[R];
  for (int64_t r = 0; r < R; ++r) row[r] = static_cast<const uint16_t*>(w.data) + (first + r) * w.ld;
  const int64_t ahead = R * w.ld;  // the next block's rows, in elements
  __m512 sum[R];
  for (int64_t r = 0; r < R; ++r) sum[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kPairs <= k; i += kPairs) {
    __m512bh x;
    copy_bits(_mm512_loadu_si512(a16 + i), x);
    for (int64_t r = 0; r < R; ++r) {
      __builtin_prefetch(row[r] + i + ahead);
      __m512bh v;
      copy_bits(_mm512_loadu_si512(row[r] + i), v);
      sum[r] = _mm512_dpbf16_ps(sum[r], x, v);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float lanes[kLanes];
    _mm512_storeu_ps(lanes, sum[r]);
    float total = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
    for (int64_t j = i; j < k; ++j) total = std::fma(bf16_to_f32(a16[j]), bf16_to_f32(row[r][j]), total);
    c[r] = accumulate ? c[r] + total : total;
  }
}

#if defined(__AVX512BW__)
// MXFP4 weights times BF16-rounded activations a16 (ProductPrecision::BF16): a block's 32 E2M1 codes are
// looked up as their BF16 values (exact: at most two significant bits) in one permute, multiplied on one
// vdpbf16ps into the block's partial sums, and those added into the row's lanes times the block's scale
// 2^(s - 127) (a power of two: exact unless it leaves f32's range), one fused multiply-add. Each row one
// thread's fixed sequence, as rows_dot_bf16.
template <int64_t R>
void rows_dot_mxfp4_bf16(const uint16_t* a16, const WeightView& w, int64_t first, float* c, bool accumulate) {
  // The BF16 bits of E2M1 codes 0..15: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (the upper 16 entries unused).
  alignas(64) static constexpr uint16_t kE2m1Bf16[32] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040,
                                                         0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0,
                                                         0xC000, 0xC040, 0xC080, 0xC0C0};
  const __m512i table = _mm512_load_si512(kE2m1Bf16);
  constexpr __mmask32 all32 = 0xFFFFFFFFu;
  const int64_t k = w.cols;  // whole blocks (WeightView::validate)
  RowPointers row[R];
  for (int64_t r = 0; r < R; ++r) row[r] = row_pointers(w, first + r);
  const int64_t ahead_bytes = R * w.ld / 2;
  __m512 sum[R];
  for (int64_t r = 0; r < R; ++r) sum[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += kMxfp4Block) {
    __m512bh x;
    copy_bits(_mm512_loadu_si512(a16 + i), x);
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* p = static_cast<const uint8_t*>(row[r].values) + i / 2;
      if ((i / 2) % 64 == 0) __builtin_prefetch(p + ahead_bytes);
      // Byte j as the 32-bit lane (low nibble) | (high nibble) << 16: words 2j and 2j + 1 in element order.
      const __m512i bytes =
          _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m512i codes =
          _mm512_maskz_or_epi32(kAll, _mm512_maskz_and_epi32(kAll, bytes, _mm512_set1_epi32(0x0f)),
                                _mm512_maskz_slli_epi32(kAll, _mm512_maskz_srli_epi32(kAll, bytes, 4), 16));
      __m512bh v;
      copy_bits(_mm512_maskz_permutexvar_epi16(all32, codes, table), v);
      const __m512 block = _mm512_dpbf16_ps(_mm512_setzero_ps(), x, v);
      const float scale = e8m0_value(static_cast<const uint8_t*>(row[r].scales)[i / kMxfp4Block]);
      sum[r] = _mm512_maskz_fmadd_ps(kAll, block, _mm512_set1_ps(scale), sum[r]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float lanes[kLanes];
    _mm512_storeu_ps(lanes, sum[r]);
    float total = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
    c[r] = accumulate ? c[r] + total : total;
  }
}
#endif
#endif

// Rows [begin, end) of a product: whole kRows blocks, then single rows (only the product's last rows).
template <WeightFormat F, bool kNanCodes = true>
void rows_of_format(const MatvecProduct& p, int64_t begin, int64_t end) {
  int64_t j = begin;
  for (; j + kRows <= end; j += kRows) rows_dot<F, kRows, kNanCodes>(p.a, p.b, j, p.c + j, p.accumulate);
  for (; j < end; ++j) rows_dot<F, 1, kNanCodes>(p.a, p.b, j, p.c + j, p.accumulate);
}

// A product as its rows are computed: under ProductPrecision::BF16 over a narrow weight, `a` is the rounded
// activations' values (f32) and, where the BF16 dot products multiply it (BF16 and MXFP4 weights), a16 the
// same activations as BF16.
struct PreparedProduct {
  MatvecProduct p;
  const uint16_t* a16 = nullptr;
};

void rows(const PreparedProduct& prepared, int64_t begin, int64_t end) {
  const MatvecProduct& p = prepared.p;
#if defined(__AVX512BF16__)
  if (prepared.a16 != nullptr && p.b.format == WeightFormat::BF16) {
    int64_t j = begin;
    for (; j + kRows <= end; j += kRows) rows_dot_bf16<kRows>(prepared.a16, p.b, j, p.c + j, p.accumulate);
    for (; j < end; ++j) rows_dot_bf16<1>(prepared.a16, p.b, j, p.c + j, p.accumulate);
    return;
  }
#if defined(__AVX512BW__)
  if (prepared.a16 != nullptr && p.b.format == WeightFormat::MXFP4) {
    int64_t j = begin;
    for (; j + kRows <= end; j += kRows)
      rows_dot_mxfp4_bf16<kRows>(prepared.a16, p.b, j, p.c + j, p.accumulate);
    for (; j < end; ++j) rows_dot_mxfp4_bf16<1>(prepared.a16, p.b, j, p.c + j, p.accumulate);
    return;
  }
#endif
#endif
  switch (p.b.format) {
    case WeightFormat::F32:
      return rows_of_format<WeightFormat::F32>(p, begin, end);
    case WeightFormat::BF16:
      return rows_of_format<WeightFormat::BF16>(p, begin, end);
    case WeightFormat::F16:
      return rows_of_format<WeightFormat::F16>(p, begin, end);
    case WeightFormat::MXFP4:
      return rows_of_format<WeightFormat::MXFP4>(p, begin, end);
    case WeightFormat::FP8:
      if (p.b.fp8_nan_free) return rows_of_format<WeightFormat::FP8, false>(p, begin, end);
      return rows_of_format<WeightFormat::FP8>(p, begin, end);
  }
}

// The rows of a product's chunk: about kChunkBytes of weights, whole kRows blocks.
int64_t chunk_rows(const MatvecProduct& p) {
  const int64_t row_bytes = std::max<int64_t>(static_cast<int64_t>(p.b.row_bytes()), 1);
  return std::max<int64_t>(1, kChunkBytes / row_bytes / kRows) * kRows;
}

// A thread's run of chunks [next, end), both in one atomic word (next in the low half) so that the owner
// taking from the front and a thief taking from the back never hand out the same chunk.
struct alignas(64) ChunkRun {
  std::atomic<uint64_t> bounds{0};
  void reset(int64_t next, int64_t end) {
    bounds.store(static_cast<uint64_t>(next) | static_cast<uint64_t>(end) << 32, std::memory_order_relaxed);
  }
  static int64_t next_of(uint64_t b) { return static_cast<int64_t>(b & 0xffffffffu); }
  static int64_t end_of(uint64_t b) { return static_cast<int64_t>(b >> 32); }
  // The front chunk (owner) or the back chunk (thief), or -1 when the run is empty.
  int64_t take(bool front) {
    uint64_t b = bounds.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t next = next_of(b), end = end_of(b);
      if (next >= end) return -1;
      const uint64_t taken = front ? b + 1 : b - (uint64_t{1} << 32);
      if (bounds.compare_exchange_weak(b, taken, std::memory_order_relaxed)) return front ? next : end - 1;
    }
  }
  int64_t left() const {
    const uint64_t b = bounds.load(std::memory_order_relaxed);
    return std::max<int64_t>(0, end_of(b) - next_of(b));
  }
};

// The calling thread's next chunk: its own run's front, then the back of the fullest other run; -1 when
// every run is empty.
int64_t take_chunk(std::vector<ChunkRun>& runs, int self) {
  if (self < static_cast<int>(runs.size())) {
    const int64_t own = runs[self].take(true);
    if (own >= 0) return own;
  }
  for (;;) {
    int victim = -1;
    int64_t most = 0;
    for (int t = 0; t < static_cast<int>(runs.size()); ++t) {
      const int64_t left = runs[t].left();
      if (left > most) most = left, victim = t;
    }
    if (victim < 0) return -1;
    const int64_t stolen = runs[victim].take(false);
    if (stolen >= 0) return stolen;
  }
}

}  // namespace

void matvec_transposed(const float* a, const WeightView& b, float* c, bool accumulate) {
  const MatvecProduct product{a, b, c, accumulate};
  matvec_transposed_many({&product, 1});
}

void matvec_transposed(const float* a, const float* b, float* c, int64_t n, int64_t k, int64_t ldb,
                       bool accumulate) {
  matvec_transposed(a, WeightView::f32(b, n, k, ldb), c, accumulate);
}

namespace {

// The products as their rows are computed (PreparedProduct): under ProductPrecision::BF16 each distinct
// activation row of a product over a narrow weight is rounded once, into per-thread scratch that lives until
// the next call on this thread.
std::vector<PreparedProduct> prepare(std::span<const MatvecProduct> products) {
  std::vector<PreparedProduct> prepared(products.size());
  const ProductPrecision precision = product_precision();
  thread_local std::vector<std::vector<float>> rounded;
  thread_local std::vector<std::vector<uint16_t>> rounded16;
  std::vector<const float*> sources;  // the activation rows rounded so far, by index into the scratch
  for (size_t i = 0; i < products.size(); ++i) {
    const MatvecProduct& p = products[i];
    prepared[i].p = p;
    if (!rounds_activations(precision, p.b.format == WeightFormat::F32)) continue;
    const int64_t k = p.b.cols;
    size_t s = 0;
    while (s < sources.size() && !(sources[s] == p.a && static_cast<int64_t>(rounded[s].size()) >= k)) ++s;
    if (s == sources.size()) {
      sources.push_back(p.a);
      if (rounded.size() < sources.size()) rounded.resize(sources.size());
      if (rounded16.size() < sources.size()) rounded16.resize(sources.size());
      rounded[s].resize(static_cast<size_t>(k));
      rounded16[s].resize(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) {
        rounded16[s][j] = round_to_bf16(p.a[j]);
        rounded[s][j] = bf16_to_f32(rounded16[s][j]);
      }
    }
    prepared[i].p.a = rounded[s].data();
#if defined(__AVX512BF16__)
    if (p.b.format == WeightFormat::BF16) prepared[i].a16 = rounded16[s].data();
#if defined(__AVX512BW__)
    if (p.b.format == WeightFormat::MXFP4) prepared[i].a16 = rounded16[s].data();
#endif
#endif
  }
  return prepared;
}

}  // namespace

void matvec_transposed_many(std::span<const MatvecProduct> input) {
  int64_t weights = 0;
  for (const MatvecProduct& p : input) {
    p.b.validate();
    weights += p.b.rows * p.b.cols;
  }
  const std::vector<PreparedProduct> products = prepare(input);
  if (weights < kParallelMin || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (const PreparedProduct& p : products) rows(p, 0, p.p.b.rows);
    return;
  }
  // The products' chunks in order, product after product: first_chunk[i] is product i's first.
  std::vector<int64_t> first_chunk(products.size() + 1, 0);
  for (size_t i = 0; i < products.size(); ++i) {
    const int64_t step = chunk_rows(products[i].p);
    first_chunk[i + 1] = first_chunk[i] + (products[i].p.b.rows + step - 1) / step;
  }
  const int64_t chunks = first_chunk.back();
  // Each thread starts on its own contiguous run of chunks, taken from the front, so it streams through
  // its part of the weights as the read probe does; a thread whose run is empty takes chunks from the back
  // of the run with the most left. The threads read at different speeds from moment to moment: a static
  // split left the faster one waiting at the end of every region (libgomp's spin was a large share of a
  // decode profile), and chunks dealt in order to whichever thread was free balanced that but interleaved
  // the threads' reads chunk by chunk (docs/performance_history.md, "Huge pages and m = 1 products dealt in
  // chunks" and "Reads in runs").
  const int threads = omp_get_max_threads();
  std::vector<ChunkRun> runs(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) runs[t].reset(chunks * t / threads, chunks * (t + 1) / threads);
#pragma omp parallel num_threads(threads)
  {
    const int self = omp_get_thread_num();
    size_t i = 0;
    for (int64_t chunk; (chunk = take_chunk(runs, self)) >= 0;) {
      // The product holding the chunk (few products: a scan from where the last chunk was).
      while (chunk < first_chunk[i]) --i;
      while (chunk >= first_chunk[i + 1]) ++i;
      const PreparedProduct& p = products[i];
      const int64_t step = chunk_rows(p.p), begin = (chunk - first_chunk[i]) * step;
      rows(p, begin, std::min(p.p.b.rows, begin + step));
    }
  }
}

}  // namespace expar
