// core/matvec: one row against a transposed matrix, the m = 1 products matmul() sends there. Checked against
// a double-precision dot product at shapes with every tail (k below, at and past the 16 lanes, n not a
// multiple of the row block), a leading dimension wider than k, plain (a NaN-poisoned output is never
// read) and accumulating; the same bits at 1 and 2 compute threads, and matmul() with m = 1 and a
// transposed B gives exactly matvec's result; several products in one region give each product's own bits.
#include "expar/core/matvec.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/random_vector.hpp"
#include "expar/core/matmul.hpp"

namespace expar {
namespace {

struct Shape {
  int64_t n, k, ldb;
};

// c[j] (+)= Σ a[i]·b[j·ldb + i] in double; the float result is within a few ulp of Σ|a·b| of it.
void expect_matches_double_dot(const std::vector<float>& a, const std::vector<float>& b,
                               const std::vector<float>& c0, const std::vector<float>& c, const Shape& s,
                               bool accumulate) {
  for (int64_t j = 0; j < s.n; ++j) {
    double dot = 0.0, magnitude = 0.0;
    for (int64_t i = 0; i < s.k; ++i) {
      const double term =
          static_cast<double>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(j * s.ldb + i)];
      dot += term;
      magnitude += std::fabs(term);
    }
    if (accumulate) {
      dot += c0[static_cast<size_t>(j)];
      magnitude += std::fabs(c0[static_cast<size_t>(j)]);
    }
    ASSERT_NEAR(c[static_cast<size_t>(j)], dot, 1e-6 * magnitude + 1e-30)
        << "row " << j << " of n " << s.n << ", k " << s.k << ", ldb " << s.ldb
        << (accumulate ? ", accumulating" : "");
  }
}

TEST(Matvec, MatchesADoubleDotProductAtEveryTail) {
  const int saved_threads = compute_threads();
  for (const Shape s :
       {Shape{1, 1, 1}, Shape{3, 15, 15}, Shape{4, 16, 20}, Shape{5, 17, 17}, Shape{7, 33, 40},
        Shape{64, 1000, 1003}, Shape{1027, 1024, 1024}, Shape{2048, 512, 520}}) {
    const std::vector<float> a = random_vector(static_cast<size_t>(s.k), 5, 1);
    const std::vector<float> b = random_vector(static_cast<size_t>(s.n * s.ldb), 5, 2);
    const std::vector<float> c0 = random_vector(static_cast<size_t>(s.n), 5, 3);
    for (const bool accumulate : {false, true}) {
      std::vector<float> by_threads[2];
      for (const int threads : {1, 2}) {
        set_compute_threads(threads);
        std::vector<float> c = accumulate ? c0
                                          : std::vector<float>(static_cast<size_t>(s.n),
                                                               std::numeric_limits<float>::quiet_NaN());
        matvec_transposed(a.data(), b.data(), c.data(), s.n, s.k, s.ldb, accumulate);
        expect_matches_double_dot(a, b, c0, c, s, accumulate);
        by_threads[threads - 1] = c;
      }
      EXPECT_EQ(by_threads[0], by_threads[1])
          << "n " << s.n << " k " << s.k << ": the thread count changed bits";
    }
  }
  set_compute_threads(saved_threads);
}

TEST(Matvec, IsWhatMatmulRunsForOneRowAgainstATransposedMatrix) {
  const Shape s{300, 257, 260};
  const std::vector<float> a = random_vector(static_cast<size_t>(s.k), 5, 4);
  const std::vector<float> b = random_vector(static_cast<size_t>(s.n * s.ldb), 5, 5);
  const std::vector<float> c0 = random_vector(static_cast<size_t>(s.n), 5, 6);
  for (const bool accumulate : {false, true}) {
    std::vector<float> direct = c0, through = c0;
    matvec_transposed(a.data(), b.data(), direct.data(), s.n, s.k, s.ldb, accumulate);
    MatmulArgs p;
    p.a = a.data();
    p.b = b.data();
    p.c = through.data();
    p.m = 1;
    p.n = s.n;
    p.k = s.k;
    p.trans_b = true;
    p.ldb = s.ldb;
    p.accumulate = accumulate;
    matmul(p);
    EXPECT_EQ(direct, through) << (accumulate ? "accumulating" : "plain");
  }
}

// Several products in one region (decode's experts): each output is exactly what the product gives alone,
// at 1, 2 and 4 compute threads (4 puts more runs than chunks on the small products, and threads take chunks
// from each other's runs), with an empty product between the others and products of different widths.
TEST(Matvec, ManyProductsInOneRegionGiveEachProductsOwnBits) {
  const std::vector<Shape> shapes{Shape{2048, 512, 520}, Shape{0, 64, 64}, Shape{7, 33, 40},
                                  Shape{1027, 1024, 1024}, Shape{300, 257, 260}};
  std::vector<std::vector<float>> a, b, alone;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    a.push_back(random_vector(static_cast<size_t>(s.k), 7, 3 * i));
    b.push_back(random_vector(static_cast<size_t>(s.n * s.ldb), 7, 3 * i + 1));
    alone.emplace_back(static_cast<size_t>(s.n));
    set_compute_threads(1);
    matvec_transposed(a[i].data(), b[i].data(), alone[i].data(), s.n, s.k, s.ldb, false);
  }
  const int saved_threads = compute_threads();
  for (const int threads : {1, 2, 4}) {
    set_compute_threads(threads);
    for (int repeat = 0; repeat < 20; ++repeat) {
      std::vector<std::vector<float>> c;
      std::vector<MatvecProduct> products;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Shape& s = shapes[i];
        c.emplace_back(static_cast<size_t>(s.n), std::numeric_limits<float>::quiet_NaN());
        products.push_back({a[i].data(), WeightView::f32(b[i].data(), s.n, s.k, s.ldb), c[i].data(), false});
      }
      matvec_transposed_many(products);
      for (size_t i = 0; i < shapes.size(); ++i)
        ASSERT_EQ(c[i], alone[i]) << "product " << i << " at " << threads << " threads, repeat " << repeat;
    }
  }
  set_compute_threads(saved_threads);
}

}  // namespace
}  // namespace expar
