#pragma once
// Block-scaled FP8 weights as DeepSeek-V3 and Qwen3's FP8 releases store them: NAME (F8_E4M3, [out, in]) and
// NAME_scale_inv (F32, [ceil(out/128), ceil(in/128)]), the multiplier of each 128 × 128 block. Fp8Store wraps
// a store and hands out NAME's views with their block scales attached (Tensor::with_block_scales), so the
// loaders keep them as stored (held_as_stored) and the products multiply them as such
// (core/weight_view.hpp); the scale tensors themselves are not separate weights.
#include <memory>

#include "expar/model/tensor_store.hpp"

namespace expar {

class Fp8Store final : public TensorStore {
 public:
  explicit Fp8Store(std::unique_ptr<TensorStore> base);
  std::string label() const override;
  bool contains(const std::string& name) const override;
  const TensorInfo& info(const std::string& name) const override;
  // Rows [begin, end) of an FP8 weight carry its whole scale grid, placed by row0 = begin. An F8_E4M3
  // tensor without NAME_scale_inv, or with a grid of the wrong shape, throws expar::Error naming both.
  Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const override;
  bool mapped(const std::string& name) const override;
  void release_rows(const std::string& name, int64_t begin, int64_t end) const override;

 private:
  std::unique_ptr<TensorStore> base_;
};

}  // namespace expar
