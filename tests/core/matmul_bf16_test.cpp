// BF16 products with f32 accumulation (core/matmul.hpp: matmul_bf16) against an f64 reference computed from
// the same BF16 operands, for the four transpose combinations, plain and accumulating, packed and with
// leading dimensions wider than the matrices (whose gaps must stay unwritten), m = 1, k = 0, m = 0 and n = 0;
// one primitive per layout serving every shape; the rounding helper against core/convert.hpp's f32_to_bf16;
// and the native-BF16 query. ctest runs it again with oneDNN capped at AVX512_CORE (BF16 products emulated:
// still correct, bf16_native() false and --precision bf16 refused by name) and at AVX2 (no BF16 matmul in
// oneDNN: the product throws expar::Error naming the ISA).
//
// Tolerance. The BF16 operands' products are exact in f32 (8-bit significands), so the only error is the f32
// summation of k products (k + 1 terms when accumulating onto C): in any order and blocking, |c − exact| ≤
// γ_t·(Σ|a_i·b_i| + |c0|) with t the number of terms, γ_t = t·u/(1 − t·u), u = 2^-24 (Higham, Accuracy and
// Stability, 3.1). The test uses exactly that bound per element, not loosened (plus 2^-126 for the flush of
// a denormal partial sum, which the BF16 dot-product instructions do).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/expect_error.hpp"
#include "core/random_vector.hpp"
#include "expar/core/convert.hpp"
#include "expar/core/matmul.hpp"

namespace expar {
namespace {

bool has_bf16_matmul() {
  // oneDNN 2.6 has a BF16 matmul from AVX-512 (avx512_core) up.
  const std::string isa = dnnl_isa_name();
  return isa.rfind("avx512_core", 0) == 0;
}

// n values ~ N(0, 1) rounded to BF16.
std::vector<uint16_t> random_bf16(size_t n, uint64_t stream) {
  const std::vector<float> v = random_vector(n, 11, stream);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

struct Case {
  int64_t m, n, k;
  bool trans_a, trans_b, accumulate, padded;
};

// Runs the product and checks every element of C against the f64 reference within the bound above, and the
// gaps of a wide C (ldc > n) unwritten.
void check_case(const Case& t) {
  SCOPED_TRACE(::testing::Message() << "m=" << t.m << " n=" << t.n << " k=" << t.k << " trans_a=" << t.trans_a
                                    << " trans_b=" << t.trans_b << " accumulate=" << t.accumulate
                                    << " padded=" << t.padded);
  const int64_t pad = t.padded ? 7 : 0;
  const int64_t lda = (t.trans_a ? t.m : t.k) + pad, ldb = (t.trans_b ? t.k : t.n) + pad, ldc = t.n + pad;
  const int64_t a_rows = t.trans_a ? t.k : t.m, b_rows = t.trans_b ? t.n : t.k;
  const std::vector<uint16_t> a = random_bf16(static_cast<size_t>(a_rows * lda), 1);
  const std::vector<uint16_t> b = random_bf16(static_cast<size_t>(b_rows * ldb), 2);
  std::vector<float> c = random_vector(static_cast<size_t>(t.m * ldc), 11, 3);
  const std::vector<float> c0 = c;
  auto at = [&](int64_t i, int64_t p) {
    return double(bf16_to_f32(a[static_cast<size_t>(t.trans_a ? p * lda + i : i * lda + p)]));
  };
  auto bt = [&](int64_t p, int64_t j) {
    return double(bf16_to_f32(b[static_cast<size_t>(t.trans_b ? j * ldb + p : p * ldb + j)]));
  };
  MatmulBf16Args args{.a = a.data(),
                      .b = b.data(),
                      .c = c.data(),
                      .m = t.m,
                      .n = t.n,
                      .k = t.k,
                      .trans_a = t.trans_a,
                      .trans_b = t.trans_b,
                      .accumulate = t.accumulate};
  if (t.padded) {
    args.lda = lda;
    args.ldb = ldb;
    args.ldc = ldc;
  }
  matmul_bf16(args);
  const double u = std::ldexp(1.0, -24);
  const int64_t terms = t.k + (t.accumulate ? 1 : 0);
  const double gamma = double(terms) * u / (1.0 - double(terms) * u);
  int64_t bad = 0;
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t j = 0; j < t.n; ++j) {
      const double start = t.accumulate ? double(c0[static_cast<size_t>(i * ldc + j)]) : 0.0;
      double exact = start, magnitude = std::fabs(start);
      for (int64_t p = 0; p < t.k; ++p) {
        exact += at(i, p) * bt(p, j);
        magnitude += std::fabs(at(i, p) * bt(p, j));
      }
      const double got = c[static_cast<size_t>(i * ldc + j)];
      const double bound = gamma * magnitude + 0x1p-126;
      if (!(std::fabs(got - exact) <= bound) && ++bad <= 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", f64 reference " << exact << ", error "
                      << std::fabs(got - exact) << " > bound " << bound;
    }
    for (int64_t j = t.n; j < ldc; ++j)
      EXPECT_EQ(std::memcmp(&c[static_cast<size_t>(i * ldc + j)], &c0[static_cast<size_t>(i * ldc + j)], 4),
                0)
          << "gap C[" << i << "," << j << "] written";
  }
}

TEST(MatmulBf16, MatchesTheF64ReferenceOfItsOperandsInEveryLayout) {
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true})
      for (const bool accumulate : {false, true})
        for (const bool padded : {false, true})
          for (const auto& [m, n, k] : {std::tuple{37, 29, 300}, std::tuple{64, 96, 2048},
                                        std::tuple{1, 50, 700}, std::tuple{130, 1, 33}, std::tuple{3, 5, 1}})
            check_case({m, n, k, trans_a, trans_b, accumulate, padded});
}

TEST(MatmulBf16, ServesEveryShapeFromOnePrimitivePerLayout) {
  // Sizes changing call after call (the grouped GEMM's row counts) through the cached runtime-size
  // primitive, interleaved with other layouts.
  if (!has_bf16_matmul()) GTEST_SKIP() << "oneDNN has no BF16 matmul on " << dnnl_isa_name();
  for (const int64_t m : {5, 128, 1, 77, 16, 300})
    for (const bool trans_b : {true, false}) check_case({m, 48, 96 + m, false, trans_b, m % 2 == 1, m == 77});
}

TEST(MatmulBf16, EmptyProductsClearOrKeepC) {
  // k = 0: C = 0 (a product of nothing), or C unchanged when accumulating; m = 0 or n = 0: nothing to do.
  // These never reach oneDNN, so they hold on every CPU.
  std::vector<float> c(12, 3.0f);
  MatmulBf16Args args{.a = nullptr, .b = nullptr, .c = c.data(), .m = 3, .n = 4, .k = 0, .accumulate = true};
  matmul_bf16(args);
  for (float v : c) EXPECT_EQ(v, 3.0f);
  args.accumulate = false;
  args.ldc = 4;
  matmul_bf16(args);
  for (float v : c) EXPECT_EQ(v, 0.0f);
  std::fill(c.begin(), c.end(), 3.0f);
  args.k = 5;
  args.m = 0;
  matmul_bf16(args);
  args.m = 3;
  args.n = 0;
  matmul_bf16(args);
  for (float v : c) EXPECT_EQ(v, 3.0f);
}

TEST(MatmulBf16, RefusedUnderBatchInvariance) {
  std::vector<uint16_t> a(4, 0x3F80), b(4, 0x3F80);
  std::vector<float> c(4);
  set_matmul_min_rows(16);
  testing::expect_error(
      [&] { matmul_bf16({.a = a.data(), .b = b.data(), .c = c.data(), .m = 2, .n = 2, .k = 2}); },
      {"batch invariance"});
  set_matmul_min_rows(0);
}

TEST(MatmulBf16, ThrowsByNameWhereOneDnnHasNoBf16Matmul) {
  if (has_bf16_matmul()) GTEST_SKIP() << "oneDNN has a BF16 matmul on " << dnnl_isa_name();
  std::vector<uint16_t> a(4, 0x3F80), b(4, 0x3F80);
  std::vector<float> c(4);
  testing::expect_error(
      [&] { matmul_bf16({.a = a.data(), .b = b.data(), .c = c.data(), .m = 2, .n = 2, .k = 2}); },
      {"no BF16 matmul", dnnl_isa_name().c_str()});
}

TEST(MatmulBf16, NativeQueryAgreesWithTheIsaAndRefusesByName) {
  const std::string isa = dnnl_isa_name();
  EXPECT_EQ(bf16_native(), isa == "avx512_core_bf16" || isa == "avx512_core_amx") << isa;
  if (bf16_native()) {
    check_bf16_native("--precision bf16");
  } else {
    testing::expect_error([] { check_bf16_native("--precision bf16"); },
                          {"--precision bf16", "BF16 dot products", isa.c_str()});
  }
}

TEST(MatmulBf16, RoundingRowsIsF32ToBf16) {
  // Ties both ways, the largest finite values (rounding to infinity), infinities, NaNs of both signs,
  // denormals and zeros, and random values; with a wider source and destination stride.
  std::vector<float> values = {1.0f,
                               -1.0f,
                               std::bit_cast<float>(0x3F808000u),  // tie, even below: rounds down
                               std::bit_cast<float>(0x3F818000u),  // tie, odd below: rounds up
                               std::bit_cast<float>(0x3F808001u),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::quiet_NaN(),
                               std::bit_cast<float>(0x7F800001u),  // signalling NaN
                               std::numeric_limits<float>::denorm_min(),
                               0.0f,
                               -0.0f};
  const std::vector<float> r = random_vector(97, 5, 1);
  values.insert(values.end(), r.begin(), r.end());
  const int64_t cols = static_cast<int64_t>(values.size()), rows = 2, ld_src = cols + 3, ld_dst = cols + 5;
  std::vector<float> src(static_cast<size_t>(rows * ld_src), 0.0f);
  for (int64_t i = 0; i < rows; ++i) std::copy(values.begin(), values.end(), src.begin() + i * ld_src);
  std::vector<uint16_t> dst(static_cast<size_t>(rows * ld_dst), 0xABCD);
  round_rows_to_bf16(src.data(), ld_src, dst.data(), ld_dst, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      EXPECT_EQ(dst[static_cast<size_t>(i * ld_dst + j)], f32_to_bf16(values[static_cast<size_t>(j)]))
          << "value " << values[static_cast<size_t>(j)] << " at " << j;
    for (int64_t j = cols; j < ld_dst; ++j) EXPECT_EQ(dst[static_cast<size_t>(i * ld_dst + j)], 0xABCD);
  }
}

}  // namespace
}  // namespace expar
