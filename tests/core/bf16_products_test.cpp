// The weight products under ProductPrecision::BF16 (core/product_precision.hpp): for BF16, F16, MXFP4 and
// FP8 weights each output is, within the accumulation's own bound, the double-precision sum of the
// BF16-rounded activations times the weights' exact values: |error| ≤ (k + 2)·2^-24·Σ|terms| for a sum of k
// exact or once-rounded products in f32, in any order (core/matvec's vdpbf16ps, its f32 loops, oneDNN's
// BF16 matmul and sgemm over rounded values alike). Checked at ragged shapes, 1 and 2 threads, plain (a
// NaN-poisoned output is never read) and accumulating, one row (decode) and several in both forms (prefill);
// each row one thread's fixed-order sum (the same bits at any thread count and grouping), a row's bits
// independent of its batch under batch invariance, F32 weights' products unchanged, and the rounding seen
// (activations 1 + 2^-10, which BF16 rounds to 1).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/random_vector.hpp"
#include "core/stored_matrix.hpp"
#include "expar/core/matmul.hpp"
#include "expar/core/matvec.hpp"
#include "expar/core/product_precision.hpp"
#include "expar/core/weight_matmul.hpp"

namespace expar {
namespace {

using testing::random_matrix;
using testing::StoredMatrix;

constexpr double kUnit = 0x1p-24;  // f32's unit roundoff

const WeightFormat kNarrow[] = {WeightFormat::BF16, WeightFormat::F16, WeightFormat::MXFP4,
                                WeightFormat::FP8};

double bf16_value(float x) {
  return std::bit_cast<float>(static_cast<uint32_t>(f32_to_bf16(x)) << 16);
}

struct Shape {
  int64_t n, k, ld;
};

// MXFP4 rows are whole 32-value blocks; the other formats also take every tail.
std::vector<Shape> shapes(WeightFormat f) {
  if (f == WeightFormat::MXFP4) return {{1, 32, 32}, {9, 1056, 1088}, {37, 2080, 2080}, {300, 512, 512}};
  return {{1, 16, 16}, {5, 17, 17}, {9, 48, 56}, {13, 1000, 1003}, {37, 2080, 2080}, {300, 512, 512}};
}

// y (+)= x·Wᵀ for x [m, k] (row stride ldx), against Σ bf16(x)·w in double: y[i·ldy + j].
void expect_near_reference(const std::vector<float>& x, int64_t m, int64_t ldx, const StoredMatrix& w,
                           const std::vector<float>& y0, const std::vector<float>& y, int64_t ldy,
                           bool accumulate, const std::string& what) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < w.rows; ++j) {
      double sum = accumulate ? y0[static_cast<size_t>(i * ldy + j)] : 0.0;
      double magnitude = std::fabs(sum);
      for (int64_t c = 0; c < w.cols; ++c) {
        const double term =
            bf16_value(x[static_cast<size_t>(i * ldx + c)]) * static_cast<double>(w.value(j, c));
        sum += term;
        magnitude += std::fabs(term);
      }
      const double got = y[static_cast<size_t>(i * ldy + j)];
      ASSERT_LE(std::fabs(got - sum), static_cast<double>(w.cols + 2) * kUnit * magnitude + 1e-30)
          << what << ": row " << i << " output " << j << " is " << got << ", want " << sum;
    }
}

std::vector<float> poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

TEST(Bf16Products, OneRowMatchesTheRoundedDoubleProduct) {
  const int saved_threads = compute_threads();
  const ScopedProductPrecision precision(ProductPrecision::BF16);
  uint64_t seed = 100;
  for (const WeightFormat f : kNarrow)
    for (const Shape s : shapes(f)) {
      const StoredMatrix w = random_matrix(f, s.n, s.k, s.ld, ++seed);
      const std::vector<float> a = random_vector(static_cast<size_t>(s.k), seed, 1);
      const std::vector<float> c0 = random_vector(static_cast<size_t>(s.n), seed, 2);
      for (const bool accumulate : {false, true}) {
        std::vector<float> by_threads[2];
        for (const int threads : {1, 2}) {
          set_compute_threads(threads);
          std::vector<float> c = accumulate ? c0 : poisoned(static_cast<size_t>(s.n));
          matvec_transposed(a.data(), w.view(), c.data(), accumulate);
          const std::string what = fmt::format("{} n {} k {} ld {} threads {}{}", weight_format_name(f), s.n,
                                               s.k, s.ld, threads, accumulate ? " accumulating" : "");
          expect_near_reference(a, 1, s.k, w, c0, c, s.n, accumulate, what);
          by_threads[threads - 1] = c;
        }
        EXPECT_EQ(by_threads[0], by_threads[1]) << weight_format_name(f) << " n " << s.n << " k " << s.k;
      }
    }
  set_compute_threads(saved_threads);
}

TEST(Bf16Products, GroupedOneRowProductsGiveEachItsOwnBits) {
  const ScopedProductPrecision precision(ProductPrecision::BF16);
  std::vector<StoredMatrix> mats;
  for (const WeightFormat f : kNarrow) mats.push_back(random_matrix(f, 129, 1024, 1024, 200 + mats.size()));
  const std::vector<float> shared = random_vector(1024, 7, 1), other = random_vector(1024, 7, 2);
  std::vector<std::vector<float>> grouped(mats.size(), poisoned(129)), alone(mats.size(), poisoned(129));
  std::vector<MatvecProduct> products;
  for (size_t i = 0; i < mats.size(); ++i) {
    const float* a = i % 2 ? other.data() : shared.data();
    products.push_back({a, mats[i].view(), grouped[i].data(), false});
    matvec_transposed(a, mats[i].view(), alone[i].data(), false);
  }
  matvec_transposed_many(products);
  for (size_t i = 0; i < mats.size(); ++i)
    EXPECT_EQ(grouped[i], alone[i]) << weight_format_name(mats[i].format);
}

TEST(Bf16Products, SeveralRowsMatchTheRoundedDoubleProductInBothForms) {
  if (!bf16_native())
    GTEST_SKIP()
        << "BF16 weights' products of several rows run in oneDNN's BF16 matmul, which needs BF16 dot "
           "products; oneDNN runs "
        << dnnl_isa_name();
  const ScopedProductPrecision precision(ProductPrecision::BF16);
  uint64_t seed = 300;
  for (const WeightFormat f : kNarrow)
    for (const Shape s : shapes(f)) {
      const StoredMatrix w = random_matrix(f, s.n, s.k, s.ld, ++seed);
      for (const int64_t m : {3, 37}) {
        const int64_t ldx = s.k + 3, ldy = s.n + 2;
        const std::vector<float> x = random_vector(static_cast<size_t>(m * ldx), seed, 3);
        const std::vector<float> y0 = random_vector(static_cast<size_t>(m * ldy), seed, 4);
        for (const bool accumulate : {false, true}) {
          std::vector<float> y = accumulate ? y0 : poisoned(y0.size());
          matmul_weight(WeightProduct{.x = x.data(),
                                      .m = m,
                                      .ldx = ldx,
                                      .w = w.view(),
                                      .y = y.data(),
                                      .ldy = ldy,
                                      .accumulate = accumulate});
          expect_near_reference(x, m, ldx, w, y0, y, ldy, accumulate,
                                fmt::format("{} rows {} n {} k {}{}", weight_format_name(f), m, s.n, s.k,
                                            accumulate ? " accumulating" : ""));
        }
        // The column form: yᵀ = W·xᵀ for xᵀ [k, m] packed.
        std::vector<float> xt(static_cast<size_t>(s.k * m)), yt = poisoned(static_cast<size_t>(s.n * m));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t c = 0; c < s.k; ++c)
            xt[static_cast<size_t>(c * m + i)] = x[static_cast<size_t>(i * ldx + c)];
        matmul_weight_columns({.w = w.view(), .xt = xt.data(), .cols = m, .yt = yt.data()});
        std::vector<float> y(static_cast<size_t>(m * s.n));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < s.n; ++j)
            y[static_cast<size_t>(i * s.n + j)] = yt[static_cast<size_t>(j * m + i)];
        expect_near_reference(x, m, ldx, w, {}, y, s.n, false,
                              fmt::format("{} columns {} n {} k {}", weight_format_name(f), m, s.n, s.k));
      }
    }
}

TEST(Bf16Products, ARowsBitsDoNotDependOnItsBatchUnderBatchInvariance) {
  const ScopedProductPrecision precision(ProductPrecision::BF16);
  set_matmul_min_rows(batch_invariant_rows());
  const int64_t m = 37, n = 70, k = 1056;
  const std::vector<float> x = random_vector(static_cast<size_t>(m * k), 9, 1);
  for (const WeightFormat f : kNarrow) {
    const StoredMatrix w = random_matrix(f, n, k, k, 400 + static_cast<uint64_t>(f));
    std::vector<float> batch = poisoned(static_cast<size_t>(m * n));
    matmul_weight(WeightProduct{.x = x.data(), .m = m, .w = w.view(), .y = batch.data()});
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> alone = poisoned(static_cast<size_t>(n));
      matmul_weight(WeightProduct{.x = x.data() + i * k, .m = 1, .w = w.view(), .y = alone.data()});
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(std::bit_cast<uint32_t>(alone[static_cast<size_t>(j)]),
                  std::bit_cast<uint32_t>(batch[static_cast<size_t>(i * n + j)]))
            << weight_format_name(f) << " row " << i << " output " << j;
    }
  }
  set_matmul_min_rows(0);
}

TEST(Bf16Products, F32WeightsKeepTheirF32Products) {
  const StoredMatrix w = random_matrix(WeightFormat::F32, 37, 1000, 1003, 500);
  const std::vector<float> x = random_vector(4 * 1000, 500, 1);
  std::vector<float> f32_one = poisoned(37), bf16_one = poisoned(37), f32_rows = poisoned(4 * 37),
                     bf16_rows = poisoned(4 * 37);
  matvec_transposed(x.data(), w.view(), f32_one.data(), false);
  matmul_weight(WeightProduct{.x = x.data(), .m = 4, .w = w.view(), .y = f32_rows.data()});
  {
    const ScopedProductPrecision precision(ProductPrecision::BF16);
    matvec_transposed(x.data(), w.view(), bf16_one.data(), false);
    matmul_weight(WeightProduct{.x = x.data(), .m = 4, .w = w.view(), .y = bf16_rows.data()});
  }
  EXPECT_EQ(bf16_one, f32_one);
  EXPECT_EQ(bf16_rows, f32_rows);
  EXPECT_EQ(product_precision(), ProductPrecision::F32) << "the scope restores the thread's precision";
}

// Activations 1 + 2^-10 (BF16 rounds them to 1) times weights of 1: the sum is k under BF16 precision and
// k·(1 + 2^-10) under f32, far apart compared with either's rounding: the rounding is not skipped.
TEST(Bf16Products, TheActivationsAreRounded) {
  const int64_t n = 24, k = 1024, m = 3;
  for (const WeightFormat f : {WeightFormat::BF16, WeightFormat::FP8, WeightFormat::MXFP4}) {
    StoredMatrix w = random_matrix(f, n, k, k, 600);
    if (f == WeightFormat::MXFP4) {
      std::fill(w.bytes.begin(), w.bytes.end(), uint8_t{0x22});  // E2M1 1.0 in both nibbles
      std::fill(w.e8m0.begin(), w.e8m0.end(), uint8_t{127});     // 2^0
    }
    if (f == WeightFormat::BF16) std::fill(w.halves.begin(), w.halves.end(), f32_to_bf16(1.0f));
    if (f == WeightFormat::FP8) {
      std::fill(w.bytes.begin(), w.bytes.end(), uint8_t{0x38});  // E4M3 1.0
      std::fill(w.floats.begin(), w.floats.end(), 1.0f);
    }
    const std::vector<float> x(static_cast<size_t>(m * k), 1.0f + 0x1p-10f);
    for (const ProductPrecision p : {ProductPrecision::F32, ProductPrecision::BF16}) {
      const ScopedProductPrecision precision(p);
      const float want =
          p == ProductPrecision::BF16 ? static_cast<float>(k) : static_cast<float>(k) * (1.0f + 0x1p-10f);
      std::vector<float> one = poisoned(n), rows = poisoned(static_cast<size_t>(m * n));
      matvec_transposed(x.data(), w.view(), one.data(), false);
      for (float v : one) EXPECT_EQ(v, want) << weight_format_name(f) << " " << product_precision_name(p);
      if (f == WeightFormat::BF16 && p == ProductPrecision::BF16 && !bf16_native()) continue;
      matmul_weight(WeightProduct{.x = x.data(), .m = m, .w = w.view(), .y = rows.data()});
      for (float v : rows)
        EXPECT_EQ(v, want) << weight_format_name(f) << " rows " << product_precision_name(p);
    }
  }
}

TEST(Bf16Products, AnUnknownPrecisionIsRefusedByName) {
  try {
    product_precision_from_name("fp8");
    FAIL() << "fp8 accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--precision fp8"), std::string::npos) << message;
    EXPECT_NE(message.find("f32, bf16"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace expar
