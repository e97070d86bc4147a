#pragma once
// gpt-oss's MXFP4 expert weights, dequantised at load. A quantised checkpoint stores each stacked expert
// matrix NAME ([E, in, out] once dequantised: gate_up_proj [E, H, 2I], down_proj [E, I, H]) as NAME_blocks
// and NAME_scales (io/mxfp4.hpp, whose decoder this uses). Mxfp4Store wraps a store and presents NAME as an
// F32 tensor [E, in, out]; view_rows dequantises only the experts asked for, so a rank decodes only the
// experts it owns.
#include <map>
#include <memory>
#include <mutex>

#include "expar/io/mxfp4.hpp"
#include "expar/model/tensor_store.hpp"

namespace expar {

class Mxfp4Store final : public TensorStore {
 public:
  explicit Mxfp4Store(std::unique_ptr<TensorStore> base);
  std::string label() const override;
  bool contains(const std::string& name) const override;
  const TensorInfo& info(const std::string& name) const override;
  Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const override;
  // A quantised tensor is a decoded copy (not mapped); releasing it releases the blocks and scales read.
  bool mapped(const std::string& name) const override;
  void release_rows(const std::string& name, int64_t begin, int64_t end) const override;

 private:
  bool quantised(const std::string& name) const;
  std::unique_ptr<TensorStore> base_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, TensorInfo> infos_;  // the dequantised tensors' shapes, by name
};

}  // namespace expar
