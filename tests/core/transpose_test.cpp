// core/transpose: every element lands at its transposed place, with strides on both sides, for tile-sized,
// ragged and parallel-sized matrices; the destination's padding columns are never written. The same for
// transpose_streaming (non-temporal stores), including destinations that are not 16-byte aligned.
#include "expar/core/transpose.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "random_vector.hpp"

namespace expar {
namespace {

using TransposeFn = void (*)(const float*, int64_t, int64_t, int64_t, float*, int64_t);

// dst_offset shifts the destination by that many floats from the vector's (16-byte aligned) start.
void check_transpose(int64_t rows, int64_t cols, int64_t src_pad, int64_t dst_pad, TransposeFn fn = transpose,
                     int64_t dst_offset = 0) {
  const int64_t ld_src = cols + src_pad, ld_dst = rows + dst_pad;
  const std::vector<float> src = random_vector(static_cast<size_t>(rows * ld_src), 7, rows * 1000 + cols);
  std::vector<float> storage(static_cast<size_t>(cols * ld_dst + dst_offset), std::nanf(""));
  float* const out = storage.data() + dst_offset;
  fn(src.data(), rows, cols, ld_src, out, ld_dst);
  const std::span<const float> dst(out, static_cast<size_t>(cols * ld_dst));
  int64_t wrong = 0, padding_written = 0;
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r)
      wrong += std::memcmp(&dst[static_cast<size_t>(c * ld_dst + r)], &src[static_cast<size_t>(r * ld_src + c)],
                           sizeof(float)) != 0;
    for (int64_t r = rows; r < ld_dst; ++r) padding_written += !std::isnan(dst[static_cast<size_t>(c * ld_dst + r)]);
  }
  for (int64_t i = 0; i < dst_offset; ++i) padding_written += !std::isnan(storage[static_cast<size_t>(i)]);
  EXPECT_EQ(wrong, 0) << rows << " x " << cols << " strides " << ld_src << " -> " << ld_dst << " offset "
                      << dst_offset;
  EXPECT_EQ(padding_written, 0) << rows << " x " << cols << " strides " << ld_src << " -> " << ld_dst
                                << " offset " << dst_offset;
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

TEST(Transpose, StreamingStoresGiveTheSameMatrixAlignedOrNot) {
  // Tile-sized and ragged shapes, destinations aligned (offset 0: every 16-float run streamed where its row
  // stride keeps it aligned) and misaligned by one float (plain stores), and the expert MLP's shape above the
  // parallel threshold.
  for (int64_t rows : {16, 17, 33, 128})
    for (int64_t cols : {5, 16, 64})
      for (int64_t offset : {0, 1}) {
        check_transpose(rows, cols, 0, 0, transpose_streaming, offset);
        check_transpose(rows, cols, 3, 16, transpose_streaming, offset);
      }
  check_transpose(1024, 128, 0, 16, transpose_streaming);
  check_transpose(1000, 77, 5, 0, transpose_streaming, 1);
}

TEST(Transpose, EmptyMatricesAreNoOps) {
  std::vector<float> dst(4, 1.0f);
  transpose(nullptr, 0, 4, 4, dst.data(), 1);
  transpose(nullptr, 4, 0, 0, dst.data(), 4);
  transpose_streaming(nullptr, 0, 4, 4, dst.data(), 1);
  transpose_streaming(nullptr, 4, 0, 0, dst.data(), 4);
  EXPECT_EQ(dst, std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace expar
