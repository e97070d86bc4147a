#pragma once
// TensorStore: the named tensors of a checkpoint, wherever they live (our dense.safetensors +
// experts-<m>.safetensors, or Hugging Face model.safetensors(.index.json) shards). Files are mapped lazily,
// so a rank that loads only its experts maps and touches only the files and pages holding them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/io/safetensors_format.hpp"
#include "expar/model/checkpoint_manifest.hpp"
#include "expar/model/model_config.hpp"

namespace expar {

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

// A save of `expar train` (train/checkpoint.hpp's format; a run directory is read through `latest`): its
// manifest (model/checkpoint_manifest.hpp) names the dense file and which expert file holds which global
// expert. Besides the weights (under the save family's names) it holds the optimizer moments
// "optimizer.m.NAME" / "optimizer.v.NAME" and, where the weights are saved narrower than f32, the f32 masters
// "master.NAME", under our parameter names, in the weights' files (ours) or in their optimizer-*.safetensors
// (a Hugging Face family's save). Every file is checked to belong to the manifest's
// save when it is first mapped.
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

  const ModelConfig& model() const { return manifest().model; }
  const CheckpointManifest& manifest() const;
  // The names of every tensor in `file` of the save (what a reader checks it has used).
  std::vector<std::string> tensor_names_in(const std::string& file) const;
  // How many files have been mapped so far (tests check that a rank maps only its experts' files).
  size_t files_opened() const;

 private:
  struct State;
  explicit ExparCheckpointStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
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

// The store of a Hugging Face checkpoint of `format` at `path` (ShardedStore::open's paths): gpt-oss's MXFP4
// experts read as the F32 tensors they encode (Mxfp4Store), FP8 weights with their block scales attached
// (Fp8Store).
std::unique_ptr<TensorStore> open_hf_store(const std::filesystem::path& path, ModelFormat format);

}  // namespace expar
