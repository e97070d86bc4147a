#pragma once
// The manifest.json of an `expar train` save (train/checkpoint.hpp describes the files), read once for every
// reader: training's resume, the inference engine's tensor store (model/tensor_store.hpp) and the model spec
// of `expar generate|eval|serve|plan`. Also the naming rules of a save: which name a parameter is stored
// under in the save's family, and which file holds the optimizer moments of a weight file.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "expar/io/checkpoint_dir.hpp"
#include "expar/model/architecture.hpp"
#include "expar/model/model_config.hpp"

namespace expar {

// The manifest's "format": the current one, and the older one whose files carry only the step.
inline constexpr const char* kCheckpointFormat = "expar-checkpoint-2";
inline constexpr const char* kCheckpointFormatWithoutIds = "expar-checkpoint-1";

struct CheckpointManifest {
  std::filesystem::path dir;  // the step directory
  std::string label;          // its manifest.json, for messages
  int64_t step = 0;           // optimizer steps completed
  uint64_t seed = 0;
  int world = 1;
  int ep = 1;
  ModelConfig model;
  ModelFormat format = ModelFormat::Expar;  // "architecture": a Hugging Face family's save, else ours
  CheckpointIdentity identity;              // every file of the save must carry it
  std::string dense_file;
  std::map<int, std::string> file_of_expert;  // global expert -> the file holding its weights
};

// The manifest of `dir` (a run directory, resolved through `latest`, or a step directory), read strictly:
// every value in range, every file name inside the step directory, the model hash matching the model.
// Throws expar::Error naming the file and the key when one is missing, malformed or out of range.
CheckpointManifest read_checkpoint_manifest(const std::filesystem::path& dir);

// The hash of a model config that every file of a save carries (CheckpointIdentity::model_hash).
std::string checkpoint_model_hash(const ModelConfig& model);

// Our parameter names -> the names a save of `format` stores them under (the identity for ours).
class CheckpointNames {
 public:
  CheckpointNames(ModelFormat format, const ModelConfig& config);
  bool hf() const { return hf_; }
  const std::string& weight(const std::string& ours) const;
  // The file holding the optimizer moments of the weights in `file` (the same file for ours).
  std::string optimizer_file(const std::string& file) const { return hf_ ? "optimizer-" + file : file; }

 private:
  bool hf_;
  std::map<std::string, std::string> names_;
};

}  // namespace expar
