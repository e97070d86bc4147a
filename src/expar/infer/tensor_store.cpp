#include "expar/infer/tensor_store.hpp"

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
#include "expar/io/strict_json.hpp"
#include "expar/model/model_config_json.hpp"

namespace expar::infer {

namespace fs = std::filesystem;
using json = nlohmann::json;

Tensor TensorStore::view(const std::string& name) const {
  const TensorInfo& i = info(name);
  const int64_t rows = i.shape.empty() ? 1 : i.shape[0];
  if (i.shape.empty()) return view_rows(name, 0, rows).reshape(i.shape);
  return view_rows(name, 0, rows);
}

json read_manifest_json(const fs::path& dir) {
  const fs::path path = dir / "manifest.json";
  EXPAR_CHECK(fs::exists(path),
              "checkpoint '{}' has no manifest.json: pass a directory written by expar train", dir.string());
  json j = parse_strict_json(read_text_file(path), path.string(), 8);
  for (const char* key : {"model", "step", "dense_file", "expert_files"})
    EXPAR_CHECK(j.is_object() && j.contains(key),
                "{}: \"{}\" is missing: not a complete expar checkpoint manifest", path.string(), key);
  return j;
}

ModelConfig model_config_from_manifest(const fs::path& dir) {
  const json j = read_manifest_json(dir);
  try {
    return model_config_from_json(j.at("model"));
  } catch (const Error& e) {
    fail("{}: \"model\": {}", (dir / "manifest.json").string(), e.what());
  }
}

// ---- ExparCheckpointStore ----

struct ExparCheckpointStore::State {
  fs::path dir;
  std::string dense_file;
  std::map<std::string, std::string> file_of_tensor;  // expert tensors only; the rest live in dense
  CheckpointIdentity identity;                        // every file must belong to the manifest's save
  mutable std::mutex mutex;
  mutable std::map<std::string, SafetensorsFile> files;

  const SafetensorsFile& file(const std::string& name) const {
    std::lock_guard lock(mutex);
    auto it = files.find(name);
    if (it == files.end()) {
      SafetensorsFile f = SafetensorsFile::open(dir / name);
      check_checkpoint_file_identity(f.metadata(), f.label(), identity, (dir / "manifest.json").string());
      it = files.emplace(name, std::move(f)).first;
    }
    return it->second;
  }
  // "layers.L.moe.experts.E.w1" -> the expert file of E; anything else -> dense.
  const SafetensorsFile& file_for(const std::string& tensor) const {
    auto it = file_of_tensor.find(tensor);
    return file(it == file_of_tensor.end() ? dense_file : it->second);
  }
};

std::unique_ptr<ExparCheckpointStore> ExparCheckpointStore::open(const fs::path& dir) {
  ModelConfig model = model_config_from_manifest(dir);
  const json j = read_manifest_json(dir);
  auto state = std::make_unique<State>();
  state->dir = dir;
  state->dense_file = j.at("dense_file").get<std::string>();
  state->identity.step = j.at("step").get<int64_t>();
  if (j.contains("save_id")) state->identity.save_id = j.at("save_id").get<std::string>();
  if (j.contains("model_hash")) state->identity.model_hash = j.at("model_hash").get<std::string>();
  // Expert tensor names are known from the config, so the map is built without opening any expert file.
  for (auto& [file, ids] : j.at("expert_files").items())
    for (int e : ids)
      for (int l = 0; l < model.layers; ++l)
        for (const char* w : {"w1", "w2", "w3"})
          state->file_of_tensor["layers." + std::to_string(l) + ".moe.experts." + std::to_string(e) + "." +
                                w] = file;
  return std::unique_ptr<ExparCheckpointStore>(new ExparCheckpointStore(std::move(state), std::move(model)));
}

ExparCheckpointStore::ExparCheckpointStore(std::unique_ptr<State> state, ModelConfig model)
    : state_(std::move(state)), model_(std::move(model)) {}
ExparCheckpointStore::~ExparCheckpointStore() = default;

std::string ExparCheckpointStore::label() const {
  return state_->dir.string();
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

size_t ShardedStore::shards_opened() const {
  return state_->checkpoint ? state_->checkpoint->shards_opened() : 1;
}

}  // namespace expar::infer
