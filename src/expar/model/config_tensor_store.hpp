#pragma once
// The tensor headers a Hugging Face checkpoint would have, known from its config.json alone: every tensor of
// the architecture under its family's names (model/weight_names.hpp, model/gpt_oss_layout.hpp) with its
// stored shape, in the storage the config says (StoredWeights): what `expar plan --model CONFIG` plans from
// before any weight is downloaded. It holds no values: view_rows throws.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expar/model/architecture.hpp"
#include "expar/model/tensor_store.hpp"

namespace expar {

// How a config.json says its weights are stored: torch_dtype (transformers v4) or dtype (v5), float32 when
// neither is given (transformers' default); quantization_config mxfp4 (gpt-oss: the routed experts as
// NAME_blocks / NAME_scales) or fp8 (the linear layers of attention and the MLPs as F8_E4M3 with F32
// NAME_scale_inv per 128 × 128 block, as DeepSeek-V3's and Qwen3's FP8 releases; the modules it names in
// modules_to_not_convert / ignored_layers stay unquantised).
struct StoredWeights {
  DType dtype = DType::F32;  // every tensor that is not quantised
  bool mxfp4_experts = false;
  bool fp8_linear = false;
  std::vector<std::string> unquantised_modules;  // glob patterns ("model.layers.*.self_attn")
  // "bfloat16 (torch_dtype), experts MXFP4 (quantization_config)": for the plan's heading.
  std::string description;
};
// Throws expar::Error naming `label` and the key when torch_dtype / dtype names a dtype expar does not read.
StoredWeights stored_weights_of_config(const nlohmann::json& config, const std::string& label);

class ConfigTensorStore final : public TensorStore {
 public:
  // A Hugging Face format's tensors (not ours: an expar checkpoint has its weights beside its manifest).
  ConfigTensorStore(std::string label, ModelFormat format, const ModelConfig& config,
                    const ModelFeatures& features, const StoredWeights& stored);
  std::string label() const override { return label_; }
  bool contains(const std::string& name) const override { return tensors_.contains(name); }
  const TensorInfo& info(const std::string& name) const override;
  Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const override;
  // As a safetensors file would be once written: mapped.
  bool mapped(const std::string& name) const override { return true; }
  void release_rows(const std::string& name, int64_t begin, int64_t end) const override {}
  size_t size() const { return tensors_.size(); }

 private:
  void add(const std::string& name, Shape shape, DType dtype);
  // A product's weight [out, in]: FP8 with its block scales where the config quantises it, else `dtype`.
  void linear(const std::string& name, Shape shape, const StoredWeights& stored);
  std::string label_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace expar
