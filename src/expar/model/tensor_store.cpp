#include "expar/model/tensor_store.hpp"

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "expar/core/convert.hpp"
#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/model/fp8_store.hpp"
#include "expar/model/mxfp4_store.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

namespace fs = std::filesystem;
using json = nlohmann::json;

Tensor TensorStore::view(const std::string& name) const {
  const TensorInfo& i = info(name);
  const int64_t rows = i.shape.empty() ? 1 : i.shape[0];
  if (i.shape.empty()) return view_rows(name, 0, rows).reshape(i.shape);
  return view_rows(name, 0, rows);
}

// ---- ExparCheckpointStore ----

struct ExparCheckpointStore::State {
  CheckpointManifest manifest;
  std::map<std::string, std::string> file_of_tensor;  // expert weights and moments; the rest: dense
  std::string dense_optimizer_file;                   // the other moments and f32 masters
  mutable std::mutex mutex;
  mutable std::map<std::string, SafetensorsFile> files;

  const SafetensorsFile& file(const std::string& name) const {
    std::lock_guard lock(mutex);
    auto it = files.find(name);
    if (it == files.end()) {
      SafetensorsFile f = SafetensorsFile::open(manifest.dir / name);
      check_checkpoint_file_identity(f.metadata(), f.label(), manifest.identity, manifest.label);
      it = files.emplace(name, std::move(f)).first;
    }
    return it->second;
  }
  const SafetensorsFile& file_for(const std::string& tensor) const {
    auto it = file_of_tensor.find(tensor);
    if (it != file_of_tensor.end()) return file(it->second);
    const bool beside_moments = tensor.starts_with("optimizer.") || tensor.starts_with("master.");
    return file(beside_moments ? dense_optimizer_file : manifest.dense_file);
  }
};

std::unique_ptr<ExparCheckpointStore> ExparCheckpointStore::open(const fs::path& dir) {
  auto state = std::make_unique<State>();
  state->manifest = read_checkpoint_manifest(dir);
  const CheckpointManifest& m = state->manifest;
  const CheckpointNames names(m.format, m.model);
  state->dense_optimizer_file = names.optimizer_file(m.dense_file);
  // Expert tensor names are known from the config, so the map is built without opening any expert file.
  // gpt-oss's experts are stacked tensors in the dense file (train/checkpoint.hpp); their moments are not.
  const bool stacked_experts = m.format == ModelFormat::GptOss;
  const WeightNames ours = expar_weight_names();
  for (const auto& [e, file] : m.file_of_expert)
    for (int l = 0; l < m.model.layers; ++l)
      for (const char* key : {"w1", "w2", "w3", "b1", "b2", "b3"}) {  // b*: gpt-oss's expert biases
        const std::string name = ours.expert(l, e, key);
        if (!stacked_experts && key[0] == 'w') state->file_of_tensor[names.weight(name)] = file;
        for (const char* beside : {"optimizer.m.", "optimizer.v.", "master."})
          state->file_of_tensor[beside + name] = names.optimizer_file(file);
      }
  return std::unique_ptr<ExparCheckpointStore>(new ExparCheckpointStore(std::move(state)));
}

ExparCheckpointStore::ExparCheckpointStore(std::unique_ptr<State> state) : state_(std::move(state)) {}
ExparCheckpointStore::~ExparCheckpointStore() = default;

const CheckpointManifest& ExparCheckpointStore::manifest() const {
  return state_->manifest;
}

std::vector<std::string> ExparCheckpointStore::tensor_names_in(const std::string& file) const {
  return state_->file(file).names();
}

std::string ExparCheckpointStore::label() const {
  return state_->manifest.dir.string();
}

bool ExparCheckpointStore::contains(const std::string& name) const {
  return state_->file_for(name).contains(name);
}

const TensorInfo& ExparCheckpointStore::info(const std::string& name) const {
  const SafetensorsFile& f = state_->file_for(name);
  EXPAR_CHECK(f.contains(name), "checkpoint '{}': tensor '{}' is missing from {}", label(), name, f.label());
  return f.info(name);
}

Tensor ExparCheckpointStore::view_rows(const std::string& name, int64_t begin, int64_t end) const {
  info(name);
  return state_->file_for(name).view_rows(name, begin, end);
}

bool ExparCheckpointStore::mapped(const std::string& name) const {
  return state_->file_for(name).mapped();
}

void ExparCheckpointStore::release_rows(const std::string& name, int64_t begin, int64_t end) const {
  state_->file_for(name).release_rows(name, begin, end);
}

size_t ExparCheckpointStore::files_opened() const {
  std::lock_guard lock(state_->mutex);
  return state_->files.size();
}

// ---- ShardedStore ----

struct ShardedStore::State {
  fs::path path;
  std::optional<ShardedCheckpoint> checkpoint;  // a directory or an index
  std::optional<SafetensorsFile> single;        // one .safetensors file
};

std::unique_ptr<ShardedStore> ShardedStore::open(const fs::path& path) {
  auto state = std::make_unique<State>();
  state->path = path;
  if (fs::is_directory(path))
    state->checkpoint.emplace(ShardedCheckpoint::open_directory(path));
  else if (path.filename().string().ends_with(".index.json"))
    state->checkpoint.emplace(ShardedCheckpoint::open(path));
  else if (path.extension() == ".safetensors")
    state->single.emplace(SafetensorsFile::open(path));
  else
    fail("'{}' is not a checkpoint: pass a directory, a model.safetensors.index.json or a .safetensors file",
         path.string());
  return std::unique_ptr<ShardedStore>(new ShardedStore(std::move(state)));
}

ShardedStore::ShardedStore(std::unique_ptr<State> state) : state_(std::move(state)) {}
ShardedStore::~ShardedStore() = default;

std::string ShardedStore::label() const {
  return state_->path.string();
}

bool ShardedStore::contains(const std::string& name) const {
  return state_->checkpoint ? state_->checkpoint->contains(name) : state_->single->contains(name);
}

const TensorInfo& ShardedStore::info(const std::string& name) const {
  EXPAR_CHECK(contains(name), "checkpoint '{}' has no tensor '{}': is it a checkpoint of this architecture?",
              label(), name);
  return state_->checkpoint ? state_->checkpoint->info(name) : state_->single->info(name);
}

Tensor ShardedStore::view_rows(const std::string& name, int64_t begin, int64_t end) const {
  info(name);
  return state_->checkpoint ? state_->checkpoint->view_rows(name, begin, end)
                            : state_->single->view_rows(name, begin, end);
}

bool ShardedStore::mapped(const std::string& name) const {
  info(name);
  return state_->checkpoint ? state_->checkpoint->file_of(name).mapped() : state_->single->mapped();
}

void ShardedStore::release_rows(const std::string& name, int64_t begin, int64_t end) const {
  info(name);
  if (state_->checkpoint)
    state_->checkpoint->file_of(name).release_rows(name, begin, end);
  else
    state_->single->release_rows(name, begin, end);
}

std::unique_ptr<TensorStore> open_hf_store(const fs::path& path, ModelFormat format) {
  // gpt-oss's MXFP4 experts (NAME_blocks / NAME_scales) read as the F32 tensors they encode.
  if (format == ModelFormat::GptOss) return std::make_unique<Mxfp4Store>(ShardedStore::open(path));
  // FP8 weights come with their block scales (the other formats' tensors pass through).
  return std::make_unique<Fp8Store>(ShardedStore::open(path));
}

size_t ShardedStore::shards_opened() const {
  return state_->checkpoint ? state_->checkpoint->shards_opened() : 1;
}

}  // namespace expar
