#pragma once
// TensorStore: the named tensors of a checkpoint, wherever they live (our dense.safetensors +
// experts-<m>.safetensors, or Hugging Face model.safetensors(.index.json) shards). Files are mapped lazily,
// so a rank that loads only its experts maps and touches only the files and pages holding them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/io/safetensors_format.hpp"
#include "expar/model/model_config.hpp"

namespace expar::infer {

class TensorStore {
 public:
  virtual ~TensorStore() = default;
  virtual std::string label() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // Throws expar::Error naming the tensor and the store when it is missing.
  virtual const TensorInfo& info(const std::string& name) const = 0;
  // Zero-copy view of rows [begin, end) of the first dimension (the file's dtype). A view of a mapped
  // file keeps the mapping alive, so it may be kept as a weight after the store is gone.
  virtual Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const = 0;
  Tensor view(const std::string& name) const;
  // Whether view_rows(name, ...) returns the bytes of a mapped file (not a decoded copy): what a loader may
  // use in place.
  virtual bool mapped(const std::string& name) const = 0;
  // After copying rows [begin, end) of `name`, gives their mapped pages back (SafetensorsFile::release_rows),
  // so the file's pages and the copy do not both stay resident. A no-op where nothing is mapped.
  virtual void release_rows(const std::string& name, int64_t begin, int64_t end) const = 0;
};

// Our checkpoint directory (train/checkpoint.hpp's format): manifest.json names the dense file and which
// expert file holds which global expert.
class ExparCheckpointStore final : public TensorStore {
 public:
  static std::unique_ptr<ExparCheckpointStore> open(const std::filesystem::path& dir);
  ~ExparCheckpointStore() override;
  std::string label() const override;
  bool contains(const std::string& name) const override;
  const TensorInfo& info(const std::string& name) const override;
  Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const override;
  bool mapped(const std::string& name) const override;
  void release_rows(const std::string& name, int64_t begin, int64_t end) const override;

  const ModelConfig& model() const { return model_; }
  // How many files have been mapped so far (tests check that a rank maps only its experts' files).
  size_t files_opened() const;

 private:
  struct State;
  ExparCheckpointStore(std::unique_ptr<State> state, ModelConfig model);
  std::unique_ptr<State> state_;
  ModelConfig model_;
};

// A Hugging Face checkpoint: a directory (its model.safetensors.index.json and shards, or one
// model.safetensors), an index json file, or one .safetensors file.
class ShardedStore final : public TensorStore {
 public:
  static std::unique_ptr<ShardedStore> open(const std::filesystem::path& path);
  ~ShardedStore() override;
  std::string label() const override;
  bool contains(const std::string& name) const override;
  const TensorInfo& info(const std::string& name) const override;
  Tensor view_rows(const std::string& name, int64_t begin, int64_t end) const override;
  bool mapped(const std::string& name) const override;
  void release_rows(const std::string& name, int64_t begin, int64_t end) const override;
  size_t shards_opened() const;

 private:
  struct State;
  explicit ShardedStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// dir/manifest.json parsed strictly, with the keys every save has; errors name the file and the key.
nlohmann::json read_manifest_json(const std::filesystem::path& dir);

// Parses the "model" object of our manifest.json (the inverse of the trainer's writer).
ModelConfig model_config_from_manifest(const std::filesystem::path& dir);

using expar::to_f32;  // core/tensor_convert.hpp

}  // namespace expar::infer
