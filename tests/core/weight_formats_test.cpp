// Weights as stored (core/weight_view.hpp, core/matvec.hpp, core/weight_matmul.hpp). Every code of every
// format dequantises to the value core/convert.hpp's scalar decoders give (the vector widening included);
// a product over a stored matrix gives exactly the bits of the f32 product over its dequantised copy, at
// ragged shapes, row strides wider than a row, shards that start mid-block, 1, 2 and 4 threads and grouped
// with other products; and both agree with a double-precision product over values this file decodes itself.
// FP8 runs through both kernels: the one that handles NaN codes and, for codes checked free of them
// (Tensor::fp8_nan_free), the one that does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/expect_error.hpp"
#include "core/random_vector.hpp"
#include "core/stored_matrix.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matvec.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/tensor.hpp"
#include "expar/core/weight_matmul.hpp"
#include "expar/core/weight_view.hpp"

namespace expar {
namespace {

using testing::dequantised;
using testing::expect_error;
using testing::random_matrix;
using testing::StoredMatrix;

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << ": element " << i << " is " << got[i] << ", want " << want[i];
}

const WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16,
                                 WeightFormat::MXFP4, WeightFormat::FP8};

TEST(WeightFormats, EveryCodeDequantisesToItsScalarValue) {
  // BF16 and F16: all 65,536 codes in one row (the lanes and, past 65,520, the tail), NaN and infinities
  // included.
  std::vector<uint16_t> halves(65536);
  for (uint32_t c = 0; c < 65536; ++c) halves[c] = static_cast<uint16_t>(c);
  for (const WeightFormat f : {WeightFormat::BF16, WeightFormat::F16}) {
    const WeightView w = f == WeightFormat::BF16 ? WeightView::bf16(halves.data(), 1, 65531, 65536)
                                                 : WeightView::f16(halves.data(), 1, 65531, 65536);
    std::vector<float> want;
    for (int64_t c = 0; c < w.cols; ++c)
      want.push_back(f == WeightFormat::BF16 ? bf16_to_f32(halves[static_cast<size_t>(c)])
                                             : f16_to_f32(halves[static_cast<size_t>(c)]));
    expect_same_bits(dequantised(w), want, std::string(weight_format_name(f)));
  }
  // FP8: all 256 codes (subnormals, both zeros and the NaN codes), under two blocks' multipliers, the second
  // block starting mid-row.
  std::vector<uint8_t> codes(2 * 256);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
  const float multipliers[4] = {1.0f, 0.0123f, 3.7f, 1e-3f};
  const WeightView fp8 = WeightView::fp8(codes.data(), multipliers, 2, 250, 256, 2, 0, 6);
  std::vector<float> want;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 250; ++c)
      want.push_back(e4m3_to_f32(codes[static_cast<size_t>(r * 256 + c)]) * multipliers[(6 + c) / 128]);
  expect_same_bits(dequantised(fp8), want, "fp8");
  // The same codes from a block's first column (the whole-block widening), and without the NaN codes through
  // the widening that skips their handling.
  const WeightView fp8_blocks = WeightView::fp8(codes.data(), multipliers, 2, 256, 256, 2);
  want.clear();
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 256; ++c)
      want.push_back(e4m3_to_f32(codes[static_cast<size_t>(r * 256 + c)]) * multipliers[c / 128]);
  expect_same_bits(dequantised(fp8_blocks), want, "fp8 whole blocks");
  std::vector<uint8_t> no_nan = codes;
  for (uint8_t& c : no_nan)
    if ((c & 0x7f) == 0x7f) c = 0;
  WeightView fp8_nan_free = WeightView::fp8(no_nan.data(), multipliers, 2, 256, 256, 2);
  fp8_nan_free.fp8_nan_free = true;
  want.clear();
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 256; ++c)
      want.push_back(e4m3_to_f32(no_nan[static_cast<size_t>(r * 256 + c)]) * multipliers[c / 128]);
  expect_same_bits(dequantised(fp8_nan_free), want, "fp8 NaN-free whole blocks");
  // MXFP4: every byte (both nibbles of every code pair) under every E8M0 scale but NaN's, one row per scale.
  std::vector<uint8_t> blocks(255 * 128), scales(255 * 8);
  for (size_t r = 0; r < 255; ++r) {
    for (size_t b = 0; b < 128; ++b) blocks[r * 128 + b] = static_cast<uint8_t>(b + r);
    for (size_t g = 0; g < 8; ++g) scales[r * 8 + g] = static_cast<uint8_t>(r);
  }
  const WeightView mx = WeightView::mxfp4(blocks.data(), scales.data(), 255, 256, 256, 8);
  want.clear();
  for (size_t r = 0; r < 255; ++r)
    for (size_t c = 0; c < 256; ++c) {
      const uint8_t byte = blocks[r * 128 + c / 2];
      want.push_back(
          e2m1_to_f32(c % 2 ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0x0f)) *
          e8m0_to_f32(static_cast<uint8_t>(r)));
    }
  expect_same_bits(dequantised(mx), want, "mxfp4");
}

struct ProductShape {
  int64_t n, k, ld;
};

// Shapes with every tail: k below, at and past the 16 lanes and not a multiple of them (MXFP4: whole blocks),
// n not a multiple of the 8-row block, strides wider than a row, FP8 blocks cut at both edges.
std::vector<ProductShape> shapes_for(WeightFormat f) {
  if (f == WeightFormat::MXFP4)
    return {{1, 32, 32}, {3, 64, 96}, {9, 96, 96}, {17, 2880, 2880}, {300, 512, 544}, {1100, 1024, 1024}};
  return {{1, 1, 1},        {3, 15, 15},     {5, 17, 20},       {9, 130, 130},
          {17, 2880, 2890}, {300, 257, 300}, {1100, 1000, 1000}};
}

TEST(WeightFormats, ProductsGiveTheBitsOfTheF32ProductOverTheDequantisedWeights) {
  const int saved_threads = compute_threads();
  uint64_t seed = 10;
  for (const WeightFormat f : kFormats)
    for (const ProductShape& s : shapes_for(f)) {
      const StoredMatrix m = random_matrix(f, s.n, s.k, s.ld, ++seed);
      const WeightView w = m.view();
      const std::vector<float> dense = dequantised(w);
      const std::vector<float> a = random_vector(static_cast<size_t>(s.k), seed, 4);
      const std::vector<float> c0 = random_vector(static_cast<size_t>(s.n), seed, 5);
      const std::string what = fmt::format("{} n={} k={} ld={}", weight_format_name(f), s.n, s.k, s.ld);
      // The dequantised values are the ones this test decodes with the scalar decoders.
      for (int64_t r = 0; r < s.n; ++r)
        for (int64_t c = 0; c < s.k; ++c)
          ASSERT_EQ(std::bit_cast<uint32_t>(dense[static_cast<size_t>(r * s.k + c)]),
                    std::bit_cast<uint32_t>(m.value(r, c)))
              << what << " element (" << r << ", " << c << ")";
      for (const bool accumulate : {false, true}) {
        set_compute_threads(1);
        std::vector<float> want = c0;
        matvec_transposed(a.data(), dense.data(), want.data(), s.n, s.k, s.k, accumulate);
        // Within a few ulp of Σ|a·w| of a double product over the decoded values.
        for (int64_t j = 0; j < s.n; ++j) {
          double dot = accumulate ? c0[static_cast<size_t>(j)] : 0.0;
          double magnitude = std::fabs(dot);
          for (int64_t i = 0; i < s.k; ++i) {
            const double term = static_cast<double>(a[static_cast<size_t>(i)]) * m.value(j, i);
            dot += term;
            magnitude += std::fabs(term);
          }
          ASSERT_NEAR(want[static_cast<size_t>(j)], dot, 1e-6 * magnitude + 1e-30) << what << " row " << j;
        }
        // FP8 codes without NaN codes (random_matrix's) also through the kernel that skips their handling.
        for (const bool nan_free : {false, true}) {
          if (nan_free && f != WeightFormat::FP8) continue;
          WeightView v = w;
          v.fp8_nan_free = nan_free;
          for (const int threads : {1, 2, 4}) {
            set_compute_threads(threads);
            std::vector<float> c =
                accumulate ? c0 : std::vector<float>(c0.size(), std::numeric_limits<float>::quiet_NaN());
            matvec_transposed(a.data(), v, c.data(), accumulate);
            expect_same_bits(c, want,
                             fmt::format("{}, {} threads{}{}", what, threads, accumulate ? ", +=" : "",
                                         nan_free ? ", NaN-free kernel" : ""));
          }
        }
      }
    }
  set_compute_threads(saved_threads);
}

TEST(WeightFormats, Fp8RowsWithEveryCodeGiveTheDequantisedProductsBits) {
  // Every one of the 256 codes (NaN codes included) in rows of whole 128-column blocks, the matvec's block
  // path: each row's product has the bits of the f32 product over its dequantised values (NaN where a NaN
  // code sits).
  const int64_t n = 9, k = 256;
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      // Row 0: every code; the others a mix without the NaN codes 0x7f and 0xff.
      codes[static_cast<size_t>(r * k + c)] = static_cast<uint8_t>(
          r == 0 ? c : ((c * 7 + r * 13) % 256) & ~(((c * 7 + r * 13) % 128 == 127) ? 1 : 0));
  const std::vector<float> scales = {0.013f, 0.021f};
  const WeightView w = WeightView::fp8(codes.data(), scales.data(), n, k, k, 2);
  const std::vector<float> dense = dequantised(w);
  const std::vector<float> a = random_vector(static_cast<size_t>(k), 91, 4);
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  matvec_transposed(a.data(), dense.data(), want.data(), n, k, k, false);
  matvec_transposed(a.data(), w, got.data(), false);
  // A NaN's payload is no result: row 0 is NaN in both; the others are the same bits.
  EXPECT_TRUE(std::isnan(got[0]) && std::isnan(want[0])) << got[0] << " " << want[0];
  expect_same_bits(std::vector<float>(got.begin() + 1, got.end()),
                   std::vector<float>(want.begin() + 1, want.end()), "fp8 every code");
  // Rows 1.. hold every code but the NaN codes: the kernel without the NaN handling gives the same bits.
  WeightView nan_free = w.row_range(1, n);
  nan_free.fp8_nan_free = true;
  std::vector<float> fast(static_cast<size_t>(n - 1), std::nanf(""));
  matvec_transposed(a.data(), nan_free, fast.data(), false);
  expect_same_bits(fast, std::vector<float>(want.begin() + 1, want.end()), "fp8 NaN-free kernel");
}

TEST(WeightFormats, Fp8TensorsAreCheckedForNanCodesWhenTheirScalesAreAttached) {
  // Codes 0..255 but the two NaN codes, cycled over a [rows, 300] matrix (a row is no multiple of the 8 codes
  // the check reads at a time); then one NaN code, 0x7f or 0xff, at each of several places, the last
  // element included.
  const int64_t rows = 130, cols = 300, n = rows * cols;
  std::vector<uint8_t> clean(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code = static_cast<uint8_t>(i * 37 % 256);
    clean[static_cast<size_t>(i)] = (code & 0x7f) == 0x7f ? static_cast<uint8_t>(code - 1) : code;
  }
  const std::vector<float> grid_values = {0.5f, 0.25f, 0.125f, 2.0f, 4.0f, 8.0f};
  auto with_scales = [&](std::vector<uint8_t>& codes) {
    Tensor grid = Tensor::empty({2, 3});
    std::memcpy(grid.data<float>(), grid_values.data(), grid_values.size() * sizeof(float));
    return Tensor::borrow(codes.data(), {rows, cols}, DType::F8E4M3).with_block_scales(grid);
  };
  const Tensor checked = with_scales(clean);
  EXPECT_TRUE(checked.fp8_nan_free());
  EXPECT_TRUE(weight_view(checked).fp8_nan_free);
  EXPECT_TRUE(checked.rows(3, 90).fp8_nan_free());
  EXPECT_TRUE(checked.clone().fp8_nan_free());
  EXPECT_FALSE(Tensor::borrow(clean.data(), {rows, cols}, DType::F8E4M3).fp8_nan_free());  // never checked
  const std::vector<float> a = random_vector(static_cast<size_t>(cols), 93, 1);
  const std::vector<float> dense = dequantised(weight_view(checked));
  std::vector<float> want(static_cast<size_t>(rows)), got(want.size(), std::nanf(""));
  matvec_transposed(a.data(), dense.data(), want.data(), rows, cols, cols, false);
  matvec_transposed(a.data(), weight_view(checked), got.data(), false);
  expect_same_bits(got, want, "checked fp8 tensor");
  for (const int64_t at : {int64_t{0}, int64_t{7}, int64_t{8}, cols + 5, n / 2 + 3, n - 1})
    for (const uint8_t nan_code : {uint8_t{0x7f}, uint8_t{0xff}}) {
      std::vector<uint8_t> codes = clean;
      codes[static_cast<size_t>(at)] = nan_code;
      const Tensor t = with_scales(codes);
      EXPECT_FALSE(t.fp8_nan_free()) << "NaN code " << int{nan_code} << " at " << at;
      EXPECT_FALSE(weight_view(t).fp8_nan_free);
      // The NaN reaches the one output whose row holds it; the other rows keep their bits.
      std::fill(got.begin(), got.end(), 0.0f);
      matvec_transposed(a.data(), weight_view(t), got.data(), false);
      for (int64_t r = 0; r < rows; ++r)
        if (r == at / cols)
          EXPECT_TRUE(std::isnan(got[static_cast<size_t>(r)])) << "row " << r << ", NaN code at " << at;
        else
          ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(r)]),
                    std::bit_cast<uint32_t>(want[static_cast<size_t>(r)]))
              << "row " << r << ", NaN code at " << at;
    }
}

TEST(WeightFormats, ShardsReadTheirRowsAndColumnsOfTheWhole) {
  // TP shards: rows [r0, r1) and columns [c0, c1) of a stored matrix, FP8 shards starting mid-block.
  for (const WeightFormat f : kFormats) {
    const int64_t n = 300, k = 512;
    const StoredMatrix m = random_matrix(f, n, k, k, 41);
    const std::vector<float> whole = dequantised(m.view());
    const int64_t c0 = f == WeightFormat::MXFP4 ? 96 : 101, c1 = f == WeightFormat::MXFP4 ? 416 : 397;
    const int64_t r0 = 77, r1 = 260;
    const WeightView shard = m.view().row_range(r0, r1).col_range(c0, c1);
    ASSERT_EQ(shard.rows, r1 - r0);
    ASSERT_EQ(shard.cols, c1 - c0);
    std::vector<float> want;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) want.push_back(whole[static_cast<size_t>(r * k + c)]);
    const std::string what(weight_format_name(f));
    expect_same_bits(dequantised(shard), want, what + " shard");
    const std::vector<float> a = random_vector(static_cast<size_t>(c1 - c0), 42, 1);
    std::vector<float> got(static_cast<size_t>(r1 - r0)), ref(got.size());
    matvec_transposed(a.data(), shard, got.data(), false);
    matvec_transposed(a.data(), want.data(), ref.data(), r1 - r0, c1 - c0, c1 - c0, false);
    expect_same_bits(got, ref, what + " shard product");
  }
}

TEST(WeightFormats, GroupedProductsGiveEachProductsOwnBits) {
  const int saved_threads = compute_threads();
  std::vector<StoredMatrix> mats;
  std::vector<std::vector<float>> a, alone;
  for (const WeightFormat f : kFormats) {
    mats.push_back(random_matrix(f, 257, 1024, 1024, 50 + mats.size()));
    a.push_back(random_vector(1024, 51, mats.size()));
    alone.emplace_back(257);
    set_compute_threads(1);
    matvec_transposed(a.back().data(), mats.back().view(), alone.back().data(), false);
  }
  for (const int threads : {1, 2, 4}) {
    set_compute_threads(threads);
    std::vector<std::vector<float>> c(mats.size(), std::vector<float>(257));
    std::vector<MatvecProduct> products;
    for (size_t i = 0; i < mats.size(); ++i)
      products.push_back({a[i].data(), mats[i].view(), c[i].data(), false});
    matvec_transposed_many(products);
    for (size_t i = 0; i < mats.size(); ++i)
      expect_same_bits(c[i], alone[i], fmt::format("product {} at {} threads", i, threads));
  }
  set_compute_threads(saved_threads);
}

TEST(WeightFormats, SeveralRowsMatchTheF32ProductOverTheDequantisedWeights) {
  // Several rows dequantise W tile by tile for sgemm: against matmul() over the whole dequantised copy and a
  // double product; the tile height is set so that these shapes cut W into several tiles and a ragged last.
  const int saved_threads = compute_threads();
  for (const WeightFormat f : kFormats)
    for (const int64_t m : {1, 2, 5, 17, 64}) {
      const int64_t k = 2880, n = 2 * weight_tile_rows(k) + 37;
      const StoredMatrix w = random_matrix(f, n, k, k, 60 + static_cast<uint64_t>(m));
      const std::vector<float> dense = dequantised(w.view());
      const std::vector<float> x = random_vector(static_cast<size_t>(m * k), 61, static_cast<uint64_t>(m));
      const std::vector<float> y0 = random_vector(static_cast<size_t>(m * n), 62, static_cast<uint64_t>(m));
      const std::string what = fmt::format("{} m={} n={} k={}", weight_format_name(f), m, n, k);
      // A double product over the decoded values, and the sum of the terms' magnitudes (the tolerance).
      std::vector<double> dot(static_cast<size_t>(m * n)), magnitude(dot.size());
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < k; ++c) {
            const double term = static_cast<double>(x[static_cast<size_t>(i * k + c)]) *
                                dense[static_cast<size_t>(j * k + c)];
            dot[static_cast<size_t>(i * n + j)] += term;
            magnitude[static_cast<size_t>(i * n + j)] += std::fabs(term);
          }
      for (const bool accumulate : {false, true})
        for (const int threads : {1, 2}) {
          set_compute_threads(threads);
          std::vector<float> y = accumulate ? y0 : std::vector<float>(y0.size(), std::nanf(""));
          matmul_weight(
              WeightProduct{.x = x.data(), .m = m, .w = w.view(), .y = y.data(), .accumulate = accumulate});
          std::vector<float> ref = y0;
          matmul(x.data(), dense.data(), ref.data(), m, n, k, false, true, accumulate);
          for (size_t at = 0; at < y.size(); ++at) {
            const double want = dot[at] + (accumulate ? y0[at] : 0.0);
            const double tolerance = 1e-6 * (magnitude[at] + (accumulate ? std::fabs(y0[at]) : 0.0));
            ASSERT_NEAR(y[at], want, tolerance) << what << " element " << at << ", " << threads << " threads";
            ASSERT_NEAR(y[at], ref[at], 2 * tolerance) << what << " against matmul, element " << at;
          }
        }
    }
  set_compute_threads(saved_threads);
}

TEST(WeightFormats, ColumnFormMatchesTheF32ProductOverTheDequantisedWeights) {
  // yᵀ = W·xᵀ dequantises W tile by tile for sgemm's left operand: against a double product and matmul() over
  // the whole dequantised copy, at shapes that cut W into several tiles and a ragged last, on 1 and 2 threads
  // and inside a parallel region (the expert tasks'), the output poisoned.
  const int saved_threads = compute_threads();
  for (const WeightFormat f : kFormats)
    for (const int64_t cols : {1, 8, 17, 64}) {
      const int64_t k = 1024, n = 2 * weight_column_tile_rows(k) + 37;
      const StoredMatrix w = random_matrix(f, n, k, k, 70 + static_cast<uint64_t>(cols));
      const std::vector<float> dense = dequantised(w.view());
      const std::vector<float> xt =
          random_vector(static_cast<size_t>(k * cols), 71, static_cast<uint64_t>(cols));
      const std::string what = fmt::format("{} n={} k={} cols={}", weight_format_name(f), n, k, cols);
      std::vector<double> dot(static_cast<size_t>(n * cols)), magnitude(dot.size());
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < k; ++c)
          for (int64_t i = 0; i < cols; ++i) {
            const double term = static_cast<double>(dense[static_cast<size_t>(j * k + c)]) *
                                xt[static_cast<size_t>(c * cols + i)];
            dot[static_cast<size_t>(j * cols + i)] += term;
            magnitude[static_cast<size_t>(j * cols + i)] += std::fabs(term);
          }
      std::vector<float> ref(dot.size());
      matmul(dense.data(), xt.data(), ref.data(), n, cols, k, false, false, false);
      for (const int threads : {1, 2, -1}) {
        std::vector<float> yt(dot.size(), std::nanf(""));
        const WeightColumnsProduct p{.w = w.view(), .xt = xt.data(), .cols = cols, .yt = yt.data()};
        if (threads > 0) {
          set_compute_threads(threads);
          matmul_weight_columns(p);
        } else {
          set_compute_threads(2);
#pragma omp parallel num_threads(2)
          {
#pragma omp single
            matmul_weight_columns(p);
          }
        }
        for (size_t at = 0; at < yt.size(); ++at) {
          const double tolerance = 1e-6 * magnitude[at];
          ASSERT_NEAR(yt[at], dot[at], tolerance) << what << " element " << at << ", threads " << threads;
          ASSERT_NEAR(yt[at], ref[at], 2 * tolerance) << what << " against matmul, element " << at;
        }
      }
    }
  set_compute_threads(saved_threads);
}

TEST(WeightFormats, MalformedViewsAreRefusedWithTheRule) {
  const std::vector<uint8_t> bytes(64 * 64);
  const std::vector<uint8_t> scales(64 * 2);
  const std::vector<float> multipliers(1);
  std::vector<float> out(64 * 64);
  expect_error(
      [&] {
        dequantize_rows(WeightView::mxfp4(bytes.data(), scales.data(), 2, 48, 64, 2), 0, 2, out.data(), 64);
      },
      {"multiples of 32"});
  expect_error([&] { (void)WeightView::mxfp4(bytes.data(), scales.data(), 2, 64, 64, 2).col_range(16, 64); },
               {"start and end on a block of 32 values"});
  expect_error(
      [&] {
        dequantize_rows(WeightView::fp8(bytes.data(), multipliers.data(), 2, 200, 200, 1), 0, 2, out.data(),
                        200);
      },
      {"every 128x128 block needs its scale"});
  expect_error([&] { dequantize_rows(WeightView::bf16(nullptr, 2, 8, 4), 0, 2, out.data(), 8); },
               {"the stride must be at least a row"});
  expect_error([&] { (void)weight_format_from_name("int4"); }, {"choose one of f32, bf16, f16, mxfp4, fp8"});
}

}  // namespace
}  // namespace expar
