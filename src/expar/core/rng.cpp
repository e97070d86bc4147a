#include "expar/core/rng.hpp"

#include <cmath>

namespace expar {

std::array<uint32_t, 4> philox4x32(uint64_t key, std::array<uint32_t, 4> ctr) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return ctr;
}

namespace {
std::array<uint32_t, 4> block(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32(seed, {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                           static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)});
}
}  // namespace

uint32_t random_u32(uint64_t seed, uint64_t stream, uint64_t index) {
  return block(seed, stream, index)[0];
}

float random_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(random_u32(seed, stream, index) >> 8) * 0x1p-24f;
}

float random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  auto words = block(seed, stream, index);
  double u1 = (static_cast<double>(words[0] >> 8) + 1.0) * 0x1p-24;  // (0, 1]
  double u2 = static_cast<double>(words[1] >> 8) * 0x1p-24;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float low, float high, uint64_t offset) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = low + (high - low) * random_uniform(seed, stream, offset + static_cast<uint64_t>(i));
}

void fill_normal(Tensor& t, uint64_t seed, uint64_t stream, float stddev, uint64_t offset) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = stddev * random_normal(seed, stream, offset + static_cast<uint64_t>(i));
}

uint64_t stream_of(const char* name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c; ++c) {
    h ^= static_cast<unsigned char>(*c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace expar
