#include "expar/model/mxfp4_store.hpp"

#include "expar/core/error.hpp"

namespace expar {

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
  const int64_t in = i.shape[1], out = i.shape[2];
  const Tensor blocks = base_->view_rows(name + "_blocks", begin, end);
  const Tensor scales = base_->view_rows(name + "_scales", begin, end);
  Tensor t = Tensor::empty({end - begin, in, out}, DType::F32, MemCategory::ExpertWeights);
  dequantize_mxfp4(static_cast<const uint8_t*>(blocks.raw()), static_cast<const uint8_t*>(scales.raw()),
                   end - begin, in, out, t.data<float>());
  return t;
}

}  // namespace expar
