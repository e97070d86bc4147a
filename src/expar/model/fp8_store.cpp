#include "expar/model/fp8_store.hpp"

#include "expar/core/error.hpp"

namespace expar {

Fp8Store::Fp8Store(std::unique_ptr<TensorStore> base) : base_(std::move(base)) {}

std::string Fp8Store::label() const {
  return base_->label();
}

bool Fp8Store::contains(const std::string& name) const {
  return base_->contains(name);
}

const TensorInfo& Fp8Store::info(const std::string& name) const {
  return base_->info(name);
}

Tensor Fp8Store::view_rows(const std::string& name, int64_t begin, int64_t end) const {
  Tensor v = base_->view_rows(name, begin, end);
  if (v.dtype() != DType::F8E4M3) return v;
  const std::string scale_name = name + "_scale_inv";
  EXPAR_CHECK(
      base_->contains(scale_name),
      "checkpoint '{}': '{}' is F8_E4M3 but '{}' (its block multipliers) is missing: an FP8 checkpoint "
      "stores both (quantization_config fp8, weight_block_size [128, 128])",
      label(), name, scale_name);
  const TensorInfo& w = base_->info(name);
  const TensorInfo& s = base_->info(scale_name);
  EXPAR_CHECK(w.shape.size() == 2 && s.dtype == DType::F32 &&
                  s.shape == Shape({(w.shape[0] + kFp8Block - 1) / kFp8Block,
                                    (w.shape[1] + kFp8Block - 1) / kFp8Block}),
              "checkpoint '{}': '{}' is F8_E4M3 {} and '{}' is {} {}: the block multipliers of a [out, in] "
              "weight are "
              "F32 [ceil(out/128), ceil(in/128)]",
              label(), name, shape_string(w.shape), scale_name, dtype_name(s.dtype), shape_string(s.shape));
  return v.with_block_scales(base_->view(scale_name), begin, 0);
}

bool Fp8Store::mapped(const std::string& name) const {
  return base_->mapped(name);
}

void Fp8Store::release_rows(const std::string& name, int64_t begin, int64_t end) const {
  base_->release_rows(name, begin, end);
}

}  // namespace expar
