// core/transpose: every element lands at its transposed place, with strides on both sides, for tile-sized,
// ragged and parallel-sized matrices; the destination's padding columns are never written.
#include "expar/core/transpose.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "random_vector.hpp"

namespace expar {
namespace {

void check_transpose(int64_t rows, int64_t cols, int64_t src_pad, int64_t dst_pad) {
  const int64_t ld_src = cols + src_pad, ld_dst = rows + dst_pad;
  const std::vector<float> src = random_vector(static_cast<size_t>(rows * ld_src), 7, rows * 1000 + cols);
  std::vector<float> dst(static_cast<size_t>(cols * ld_dst), std::nanf(""));
  transpose(src.data(), rows, cols, ld_src, dst.data(), ld_dst);
  int64_t wrong = 0, padding_written = 0;
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r)
      wrong += std::memcmp(&dst[static_cast<size_t>(c * ld_dst + r)], &src[static_cast<size_t>(r * ld_src + c)],
                           sizeof(float)) != 0;
    for (int64_t r = rows; r < ld_dst; ++r) padding_written += !std::isnan(dst[static_cast<size_t>(c * ld_dst + r)]);
  }
  EXPECT_EQ(wrong, 0) << rows << " x " << cols << " strides " << ld_src << " -> " << ld_dst;
  EXPECT_EQ(padding_written, 0) << rows << " x " << cols << " strides " << ld_src << " -> " << ld_dst;
}

TEST(Transpose, EveryElementAtItsPlaceWithStridesAndRaggedTiles) {
  for (int64_t rows : {1, 7, 16, 17, 33, 128})
    for (int64_t cols : {1, 5, 16, 31, 64})
      for (int64_t pad : {0, 3}) check_transpose(rows, cols, pad, pad == 0 ? 0 : 16);
}

TEST(Transpose, LargeMatricesSpreadOverThreadsStayExact) {
  // Above the parallel threshold (2^15 elements): the expert MLP's [h, rows] -> [rows, h + 16] shape, and a
  // ragged one.
  check_transpose(1024, 128, 0, 16);
  check_transpose(1000, 77, 5, 0);
}

TEST(Transpose, EmptyMatricesAreNoOps) {
  std::vector<float> dst(4, 1.0f);
  transpose(nullptr, 0, 4, 4, dst.data(), 1);
  transpose(nullptr, 4, 0, 0, dst.data(), 4);
  EXPECT_EQ(dst, std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace expar
