#include "expar/io/mxfp4.hpp"

#include <cmath>

#include "expar/core/convert.hpp"

namespace expar {

void dequantize_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t experts, int64_t in, int64_t out,
                      float* dst) {
  const int64_t groups = in / 32;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < out; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t block = (e * out + r) * groups + g;
        const float scale = std::ldexp(1.0f, static_cast<int>(scales[block]) - 127);
        for (int64_t b = 0; b < 16; ++b) {
          const uint8_t byte = blocks[block * 16 + b];
          const int64_t c = g * 32 + 2 * b;  // the low nibble is the even element
          dst[(e * in + c) * out + r] = e2m1_to_f32(byte & 0x0F) * scale;
          dst[(e * in + c + 1) * out + r] = e2m1_to_f32(static_cast<uint8_t>(byte >> 4)) * scale;
        }
      }
}

}  // namespace expar
