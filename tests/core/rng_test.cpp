// Philox4x32-10 against the published known-answer vectors of Random123 (Salmon, Moraes, Dror & Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11; the vectors of its kat_vectors file, which
// TensorFlow's and others' Philox tests also use). philox4x32 takes the two key words as one uint64 (low
// word first) and the counter words in Random123's order.
#include "expar/core/rng.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace expar {
namespace {

using Words = std::array<uint32_t, 4>;

uint64_t key_of(uint32_t k0, uint32_t k1) {
  return static_cast<uint64_t>(k0) | (static_cast<uint64_t>(k1) << 32);
}

TEST(Philox4x32, ZeroCounterAndKey) {
  EXPECT_EQ(philox4x32(key_of(0, 0), {0, 0, 0, 0}), (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

TEST(Philox4x32, AllOnesCounterAndKey) {
  EXPECT_EQ(philox4x32(key_of(0xffffffff, 0xffffffff), {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
}

TEST(Philox4x32, DigitsOfPi) {
  EXPECT_EQ(philox4x32(key_of(0xa4093822, 0x299f31d0), {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The element at (seed, stream, index) is Philox with key = seed and counter = (index, stream), word 0.
TEST(Philox4x32, RandomU32IsTheFirstWordOfTheBlock) {
  const uint64_t seed = 0x299f31d0a4093822ull;
  EXPECT_EQ(random_u32(seed, 0x0370734413198a2eull, 0x85a308d3243f6a88ull), 0xd16cfe09u);
  EXPECT_EQ(random_u32(0, 0, 0), 0x6627e8d5u);
  // 24 high bits of the first word, scaled to [0, 1).
  EXPECT_EQ(random_uniform(0, 0, 0), static_cast<float>(0x6627e8d5u >> 8) * 0x1p-24f);
}

}  // namespace
}  // namespace expar
