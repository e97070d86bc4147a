#include "expar/infer/mxfp4_store.hpp"

#include <cmath>

#include "expar/core/error.hpp"

namespace expar::infer {

float fp4_e2m1_value(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) ? -m : m;
}

Mxfp4Store::Mxfp4Store(std::unique_ptr<TensorStore> base) : base_(std::move(base)) {}

std::string Mxfp4Store::label() const {
  return base_->label();
}

bool Mxfp4Store::quantised(const std::string& name) const {
  return !base_->contains(name) && base_->contains(name + "_blocks") && base_->contains(name + "_scales");
}

bool Mxfp4Store::contains(const std::string& name) const {
  return base_->contains(name) || quantised(name);
}

const TensorInfo& Mxfp4Store::info(const std::string& name) const {
  if (!quantised(name)) return base_->info(name);
  std::lock_guard lock(mutex_);
  auto it = infos_.find(name);
  if (it != infos_.end()) return it->second;
  const TensorInfo& b = base_->info(name + "_blocks");
  const TensorInfo& s = base_->info(name + "_scales");
  EXPAR_CHECK(b.dtype == DType::U8 && b.shape.size() == 4 && b.shape[3] == 16,
              "checkpoint '{}': '{}_blocks' is {} {}: MXFP4 blocks must be U8 [E, out, in/32, 16]", label(),
              name, dtype_name(b.dtype), shape_string(b.shape));
  EXPAR_CHECK(s.dtype == DType::U8 && s.shape == Shape({b.shape[0], b.shape[1], b.shape[2]}),
              "checkpoint '{}': '{}_scales' is {} {} but its MXFP4 blocks {} need scales U8 [{}, {}, {}]",
              label(), name, dtype_name(s.dtype), shape_string(s.shape), shape_string(b.shape), b.shape[0],
              b.shape[1], b.shape[2]);
  TensorInfo i;
  i.name = name;
  i.dtype = DType::F32;
  i.shape = {b.shape[0], b.shape[2] * 32, b.shape[1]};  // [E, in, out]
  i.data_end = static_cast<uint64_t>(i.shape[0] * i.shape[1] * i.shape[2]) * sizeof(float);
  return infos_.emplace(name, i).first->second;
}

bool Mxfp4Store::mapped(const std::string& name) const {
  return !quantised(name) && base_->mapped(name);
}

void Mxfp4Store::release_rows(const std::string& name, int64_t begin, int64_t end) const {
  if (!quantised(name)) return base_->release_rows(name, begin, end);
  base_->release_rows(name + "_blocks", begin, end);
  base_->release_rows(name + "_scales", begin, end);
}

Tensor Mxfp4Store::view_rows(const std::string& name, int64_t begin, int64_t end) const {
  if (!quantised(name)) return base_->view_rows(name, begin, end);
  const TensorInfo& i = info(name);
  EXPAR_CHECK(0 <= begin && begin <= end && end <= i.shape[0],
              "checkpoint '{}': experts [{}, {}) of '{}' are outside its {} experts", label(), begin, end,
              name, i.shape[0]);
  const int64_t in = i.shape[1], out = i.shape[2], groups = in / 32;
  const Tensor blocks = base_->view_rows(name + "_blocks", begin, end);
  const Tensor scales = base_->view_rows(name + "_scales", begin, end);
  const auto* bp = static_cast<const uint8_t*>(blocks.raw());
  const auto* sp = static_cast<const uint8_t*>(scales.raw());
  Tensor t = Tensor::empty({end - begin, in, out}, DType::F32, MemCategory::ExpertWeights);
  float* o = t.data<float>();
  for (int64_t e = 0; e < end - begin; ++e)
    for (int64_t r = 0; r < out; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t block = (e * out + r) * groups + g;
        const float scale = std::ldexp(1.0f, static_cast<int>(sp[block]) - 127);
        for (int64_t b = 0; b < 16; ++b) {
          const uint8_t byte = bp[block * 16 + b];
          const int64_t c = g * 32 + 2 * b;  // the low nibble is the even element
          o[(e * in + c) * out + r] = fp4_e2m1_value(byte & 0x0F) * scale;
          o[(e * in + c + 1) * out + r] = fp4_e2m1_value(static_cast<uint8_t>(byte >> 4)) * scale;
        }
      }
  return t;
}

}  // namespace expar::infer
