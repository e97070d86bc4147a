#include "expar/io/sharded_checkpoint.hpp"

#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "expar/core/error.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {
namespace {

// Index object -> metadata or weight_map -> one level of user metadata structure.
constexpr int kIndexMaxDepth = 8;

void check_shard_name(const std::string& file, const std::string& tensor, const std::string& label) {
  EXPAR_CHECK(
      is_name_inside_directory(file),
      "{}: weight_map maps \"{}\" to \"{}\", which is not a file name inside the checkpoint directory: "
      "shard names must be relative paths without '..'",
      label, text_excerpt(tensor), text_excerpt(file));
}

}  // namespace

struct ShardedCheckpoint::State {
  std::filesystem::path dir;
  std::string label;
  nlohmann::json metadata = nlohmann::json::object();
  std::map<std::string, std::string, std::less<>> weight_map;
  mutable std::mutex mutex;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards;  // file name -> opened shard
};

ShardedCheckpoint::ShardedCheckpoint(std::unique_ptr<State> state) : state_(std::move(state)) {}
ShardedCheckpoint::ShardedCheckpoint(ShardedCheckpoint&&) noexcept = default;
ShardedCheckpoint& ShardedCheckpoint::operator=(ShardedCheckpoint&&) noexcept = default;
ShardedCheckpoint::~ShardedCheckpoint() = default;

ShardedCheckpoint ShardedCheckpoint::open(const std::filesystem::path& index_path) {
  auto state = std::make_unique<State>();
  state->label = index_path.string();
  state->dir = index_path.parent_path();
  std::ifstream in(index_path, std::ios::binary);
  EXPAR_CHECK(in.good(), "{}: cannot open the checkpoint index: check the path", state->label);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const nlohmann::json root = parse_strict_json(text, state->label, kIndexMaxDepth);
  EXPAR_CHECK(root.is_object(), "{}: a checkpoint index must be a JSON object with \"weight_map\"",
              state->label);
  // Other top-level keys are tolerated: the index is a convention, not a specification, and writers add keys.
  if (root.contains("metadata")) {
    EXPAR_CHECK(root["metadata"].is_object(), "{}: \"metadata\" must be an object, got {}", state->label,
                json_excerpt(root["metadata"]));
    state->metadata = root["metadata"];
  }
  EXPAR_CHECK(
      root.contains("weight_map") && root["weight_map"].is_object(),
      "{}: missing \"weight_map\" object mapping tensor names to shard files: not a safetensors index",
      state->label);
  for (const auto& [name, file] : root["weight_map"].items()) {
    EXPAR_CHECK(file.is_string(), "{}: weight_map entry \"{}\" must be a file name string, got {}",
                state->label, text_excerpt(name), json_excerpt(file));
    check_shard_name(file.get<std::string>(), name, state->label);
    state->weight_map.emplace(name, file.get<std::string>());
  }
  return ShardedCheckpoint(std::move(state));
}

ShardedCheckpoint ShardedCheckpoint::open_directory(const std::filesystem::path& dir) {
  const auto index = dir / kShardedIndexName;
  if (std::filesystem::exists(index)) return open(index);
  const auto single = dir / "model.safetensors";
  EXPAR_CHECK(std::filesystem::exists(single),
              "{}: neither {} nor model.safetensors exists: not a safetensors checkpoint directory",
              dir.string(), kShardedIndexName);
  auto file = std::make_unique<SafetensorsFile>(SafetensorsFile::open(single));
  auto state = std::make_unique<State>();
  state->dir = dir;
  state->label = single.string();
  for (const auto& name : file->names()) state->weight_map.emplace(name, "model.safetensors");
  state->shards.emplace("model.safetensors", std::move(file));
  return ShardedCheckpoint(std::move(state));
}

std::vector<std::string> ShardedCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : state_->weight_map) names.push_back(name);
  return names;
}

bool ShardedCheckpoint::contains(std::string_view name) const {
  return state_->weight_map.find(name) != state_->weight_map.end();
}

const std::string& ShardedCheckpoint::shard_of(std::string_view name) const {
  auto it = state_->weight_map.find(name);
  EXPAR_CHECK(it != state_->weight_map.end(),
              "{}: no tensor named \"{}\" in the weight_map ({} tensors): check the name", state_->label,
              text_excerpt(name), state_->weight_map.size());
  return it->second;
}

const nlohmann::json& ShardedCheckpoint::metadata() const {
  return state_->metadata;
}

std::vector<std::string> ShardedCheckpoint::shard_names() const {
  std::set<std::string> files;
  for (const auto& [_, file] : state_->weight_map) files.insert(file);
  return {files.begin(), files.end()};
}

size_t ShardedCheckpoint::shards_opened() const {
  std::lock_guard lock(state_->mutex);
  return state_->shards.size();
}

const SafetensorsFile& ShardedCheckpoint::shard(const std::string& file) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->shards.find(file);
  if (it == state_->shards.end()) {
    auto opened = std::make_unique<SafetensorsFile>(SafetensorsFile::open(state_->dir / file));
    // Shards written by write_sharded_checkpoint carry the save's id, as does the index: a shard of another
    // save beside this index (a crash while an older set was being replaced) is refused by name.
    if (auto id = state_->metadata.find("save_id"); id != state_->metadata.end() && id->is_string()) {
      auto mine = opened->metadata().find("save_id");
      EXPAR_CHECK(mine != opened->metadata().end() && mine->second == id->get<std::string>(),
                  "torn checkpoint: shard {} belongs to save {} but {} to save {}: the shards come from "
                  "different saves; write the checkpoint again",
                  file, mine == opened->metadata().end() ? std::string("(none)") : mine->second,
                  state_->label, id->get<std::string>());
    }
    it = state_->shards.emplace(file, std::move(opened)).first;
  }
  return *it->second;
}

const SafetensorsFile& ShardedCheckpoint::file_of(std::string_view name) const {
  const std::string& file = shard_of(name);
  const SafetensorsFile& f = shard(file);
  EXPAR_CHECK(
      f.contains(name),
      "{}: weight_map maps \"{}\" to {}, but that shard holds no such tensor: the index and the shards "
      "disagree; regenerate the index",
      state_->label, text_excerpt(name), file);
  return f;
}

void ShardedCheckpoint::validate() const {
  for (const auto& [name, _] : state_->weight_map) file_of(name);
  for (const std::string& file : shard_names()) {
    for (const std::string& name : shard(file).names()) {
      auto it = state_->weight_map.find(name);
      EXPAR_CHECK(it != state_->weight_map.end() && it->second == file,
                  "{}: shard {} holds tensor \"{}\", which the weight_map {}: regenerate the index",
                  state_->label, file, text_excerpt(name),
                  it == state_->weight_map.end() ? std::string("does not list")
                                                 : fmt::format("maps to {}", it->second));
    }
  }
}

void write_sharded_index(const std::filesystem::path& index_path,
                         const std::map<std::string, std::string>& weight_map,
                         const nlohmann::json& metadata) {
  EXPAR_CHECK(metadata.is_object(), "{}: index metadata must be a JSON object, got {}", index_path.string(),
              json_excerpt(metadata));
  for (const auto& [name, file] : weight_map) check_shard_name(file, name, index_path.string());
  nlohmann::ordered_json root;
  root["metadata"] = metadata;
  root["weight_map"] = weight_map;
  // The index is written last and atomically (synced, renamed): it is what makes the shards a checkpoint.
  write_file_atomically(index_path, root.dump(2) + "\n");
}

std::vector<std::filesystem::path> write_sharded_checkpoint(
    const std::filesystem::path& dir, const std::map<std::string, Tensor>& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata, std::string_view prefix) {
  EXPAR_CHECK(max_shard_bytes > 0, "max_shard_bytes=0: a shard must be allowed at least one byte");
  const std::string save_id = new_save_id();
  std::vector<SafetensorsWriter> shards(1);
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    if (shards.back().size() > 0 && shards.back().data_bytes() + t.nbytes() > max_shard_bytes)
      shards.emplace_back();
    shards.back().add(name, t);
    total += t.nbytes();
  }
  std::filesystem::create_directories(dir);
  std::map<std::string, std::string> weight_map;
  std::vector<std::filesystem::path> paths;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("{}-{:05d}-of-{:05d}.safetensors", prefix, i + 1, shards.size());
    for (const auto& [key, value] : metadata) shards[i].set_metadata(key, value);
    shards[i].set_metadata("save_id", save_id);
    shards[i].write(dir / file);
    for (const TensorInfo& info : shards[i].layout()) weight_map.emplace(info.name, file);
    paths.push_back(dir / file);
  }
  write_sharded_index(dir / fmt::format("{}.safetensors.index.json", prefix), weight_map,
                      {{"total_size", total}, {"save_id", save_id}});
  return paths;
}

}  // namespace expar
