#pragma once
// Checkpoints of `expar train`, crash-consistent: each save is its own directory DIR/step-<N>/ (see
// io/checkpoint_dir.hpp: staged, synced, renamed into place, then DIR/latest moves to it) holding
//   dense.safetensors            every dense parameter (and its Adam moments), written once by world rank 0
//   experts-<m>.safetensors      the routed experts owned by EP_MP rank m, one tensor per global expert
//                                ("layers.L.moe.experts.<e>.w1" [h, d], ...), written once per EP_DP group
//                                (by its member with ep_dp coordinate 0); a replicated expert (redundant
//                                slots) only by the rank of its first slot, so every save holds logical
//                                experts and loads under any placement
//   manifest.json                model config, layout, step, seed, which file holds which expert; written
//                                last
// A model of a Hugging Face family (CheckpointInfo::format) is saved in that family's layout as well: the
// tensors carry the family's names (model/weight_names.hpp), the optimizer moments move to
// optimizer-dense.safetensors and optimizer-experts-<m>.safetensors, and config.json plus
// model.safetensors.index.json make the step directory a Hugging Face checkpoint that transformers and
// `expar generate|eval|serve` read (the manifest names the family under "architecture").
// The weights are saved in CheckpointInfo::save_dtype (`expar train --save-dtype`): F32, or BF16 (each value
// rounded to nearest even), which halves what the engine reads and holds (it keeps BF16 as stored). The
// training state stays f32 whatever it is: a BF16 save also holds each parameter's f32 master
// ("master.NAME", beside its optimizer moments), from which resume starts, so resuming is bit-identical.
// Every safetensors file's metadata carry the step, the save's id and the model config's hash, and a load
// refuses a file whose identity differs from the manifest's (a torn set), naming it.
// Every tensor is stored under its global name, so loading reshards to any layout: a rank reads the dense
// file and, from the expert files, only the rows of its own experts (zero-copy through mmap).
#include <filesystem>
#include <string>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/model/moe_transformer.hpp"
#include "expar/train/adamw.hpp"

namespace expar {

struct CheckpointInfo {
  int64_t step = 0;  // optimizer steps completed
  uint64_t seed = 0;
  ModelConfig model;
  int ep = 1;
  int world = 1;
  ModelFormat format = ModelFormat::Expar;  // a Hugging Face family: saved in its layout too
  std::string hf_config_json;               // with a family: the config.json written into each save
  DType save_dtype = DType::F32;            // the weights' dtype in the save: F32 or BF16
};

// The names --save-dtype takes ("f32", "bf16") and the dtype a name means (expar::Error naming the choices).
std::vector<std::string> save_dtype_names();
DType save_dtype_from_name(const std::string& name);

struct CheckpointSaveOptions {
  int keep_last = 0;           // keep at most this many step directories (0: all)
  bool remove_others = false;  // remove every other step directory (replacing a checkpoint of another model)
};

// Collective over `world`. `dir` is the run directory. ep_mp / ep_dp are this rank's expert groups;
// `optimizer` may be null. Any failure (a full disk, a kill) leaves the previous save complete and `latest`
// naming it.
void save_checkpoint(const std::string& dir, const CheckpointInfo& info, MoeTransformer& model,
                     AdamW* optimizer, Comm& world, Comm& ep_mp, Comm& ep_dp,
                     const CheckpointSaveOptions& options = {});

// Reads the manifest of the checkpoint `dir` (a run directory, resolved through `latest`, or a step
// directory). Throws expar::Error naming the file and key when it is missing, malformed or out of range.
CheckpointInfo read_checkpoint_info(const std::string& dir);

// The model config of `config` and of the checkpoint differ: a message naming the first field that differs
// and both values, or empty when they are the same.
std::string model_config_difference(const ModelConfig& ours, const ModelConfig& theirs);

// Loads weights (and the optimizer state when `optimizer` is not null) into `model`, whatever the layout it
// was saved with. Not collective: each rank reads what it needs. Checks that every file belongs to the
// manifest's save and that every tensor has the size the model needs.
void load_checkpoint(const std::string& dir, MoeTransformer& model, AdamW* optimizer);

// Loads the weights of a Hugging Face checkpoint directory of `format` (model.safetensors.index.json and its
// shards, or model.safetensors: e.g. a model to fine-tune) into `model`, this rank's experts only. Not
// collective. Tensors must be F32, BF16 or F16 of the model's shapes; a missing tensor is an error naming it.
void load_hf_weights(const std::filesystem::path& dir, ModelFormat format, MoeTransformer& model);

// Before training: `dir` can be written, and a checkpoint already in it is of the same model (else an error
// that names both, unless `overwrite`).
void check_checkpoint_target(const std::string& dir, const ModelConfig& model, bool overwrite);

}  // namespace expar
