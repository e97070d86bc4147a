#include "expar/core/fast_exp.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace expar {
namespace {

// Distance in units in the last place between a float and the exact (double) value.
double ulps(float got, double exact) {
  const float nearest = static_cast<float>(exact);
  const float next = std::nextafter(nearest, std::numeric_limits<float>::infinity());
  return std::fabs(static_cast<double>(got) - exact) / (static_cast<double>(next) - nearest);
}

TEST(FastExp, WithinTwoUlpAcrossTheUnclampedRange) {
  // Every 61st float bit pattern in [-87.3, 88] (~35 M values, both signs, including the tiny ones).
  double worst = 0.0;
  float worst_x = 0.0f;
  for (uint32_t bits = 0; bits < 0x80000000u; bits += 61) {
    for (float x : {std::bit_cast<float>(bits), -std::bit_cast<float>(bits)}) {
      if (!(x >= -87.3f && x <= 88.0f)) continue;
      const double u = ulps(fast_exp(x), std::exp(static_cast<double>(x)));
      if (u > worst) {
        worst = u;
        worst_x = x;
      }
    }
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
}

TEST(FastExp, ExactPointsAndClamps) {
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_NEAR(fast_exp(1.0f), 2.718281828f, 3e-7f);
  // Clamped: finite above, smallest normal range below, never inf or 0.
  EXPECT_EQ(fast_exp(1000.0f), fast_exp(88.0f));
  EXPECT_TRUE(std::isfinite(fast_exp(std::numeric_limits<float>::infinity())));
  EXPECT_EQ(fast_exp(-1000.0f), fast_exp(-87.3f));
  EXPECT_GT(fast_exp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastExp, SigmoidMatchesTheDefinition) {
  for (float x = -30.0f; x <= 30.0f; x += 0.01f) {
    const double exact = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    EXPECT_NEAR(fast_sigmoid(x), exact, 4e-7 * exact) << x;
  }
  EXPECT_EQ(fast_sigmoid(200.0f), 1.0f);
  EXPECT_GE(fast_sigmoid(-200.0f), 0.0f);
  EXPECT_LT(fast_sigmoid(-200.0f), 1e-37f);
}

}  // namespace
}  // namespace expar
