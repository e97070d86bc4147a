#pragma once
// ShardedCheckpoint: a checkpoint split over several safetensors files, as Hugging Face writes large models:
// `model.safetensors.index.json` = {"metadata": {...}, "weight_map": {tensor name: shard file name}} next to
// the shard files. Shards are opened (mapped and validated) lazily on the first lookup of one of their
// tensors, so a rank that loads only its experts maps only the shards holding them.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/core/tensor.hpp"
#include "expar/io/safetensors_file.hpp"

namespace expar {

inline constexpr std::string_view kShardedIndexName = "model.safetensors.index.json";

class ShardedCheckpoint {
 public:
  // Reads and validates the index (strict JSON; weight_map entries must be relative file names that stay
  // inside the index's directory). Opens no shard.
  static ShardedCheckpoint open(const std::filesystem::path& index_path);
  // A checkpoint directory: its model.safetensors.index.json if present, otherwise its single
  // model.safetensors (as one shard).
  static ShardedCheckpoint open_directory(const std::filesystem::path& dir);

  ShardedCheckpoint(ShardedCheckpoint&&) noexcept;
  ShardedCheckpoint& operator=(ShardedCheckpoint&&) noexcept;
  ~ShardedCheckpoint();

  // Tensor names in ascending order, as listed in the index.
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  // The shard file name (relative to the directory) the index maps `name` to.
  const std::string& shard_of(std::string_view name) const;
  // The index's "metadata" object (empty object if absent), e.g. {"total_size": ...}.
  const nlohmann::json& metadata() const;
  std::vector<std::string> shard_names() const;
  size_t shards_opened() const;

  // The opened shard holding `name`; opening it checks that it really holds `name`. Safe to call from
  // several threads; the returned file lives as long as this checkpoint.
  const SafetensorsFile& file_of(std::string_view name) const;
  const TensorInfo& info(std::string_view name) const { return file_of(name).info(name); }
  Tensor view(std::string_view name) const { return file_of(name).view(name); }
  Tensor view_rows(std::string_view name, int64_t begin_row, int64_t end_row) const {
    return file_of(name).view_rows(name, begin_row, end_row);
  }
  Tensor read(std::string_view name, MemCategory category = MemCategory::Other) const {
    return file_of(name).read(name, category);
  }
  Tensor read_rows(std::string_view name, int64_t begin_row, int64_t end_row,
                   MemCategory category = MemCategory::Other) const {
    return file_of(name).read_rows(name, begin_row, end_row, category);
  }

  // Opens every shard and checks the index against them both ways: every indexed tensor is in its shard, and
  // every tensor of a shard is indexed to that shard.
  void validate() const;

 private:
  struct State;
  explicit ShardedCheckpoint(std::unique_ptr<State> state);
  const SafetensorsFile& shard(const std::string& file) const;
  std::unique_ptr<State> state_;
};

// Writes a Hugging Face style index to `index_path`.
void write_sharded_index(const std::filesystem::path& index_path,
                         const std::map<std::string, std::string>& weight_map,
                         const nlohmann::json& metadata = nlohmann::json::object());

// Writes `tensors` into `dir` as shards "<prefix>-00001-of-0000N.safetensors" of at most `max_shard_bytes`
// of tensor data each (a larger tensor gets a shard of its own), in name order, each with `metadata`, plus
// "<prefix>.safetensors.index.json" whose metadata holds total_size. Returns the shard paths.
std::vector<std::filesystem::path> write_sharded_checkpoint(
    const std::filesystem::path& dir, const std::map<std::string, Tensor>& tensors, uint64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {}, std::string_view prefix = "model");

}  // namespace expar
