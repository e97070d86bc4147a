#pragma once
// A run's checkpoint directory (`expar train --checkpoint DIR`), crash-consistent as a whole:
//   DIR/step-<N>/          one complete checkpoint of step N (its files, manifest.json written last)
//   DIR/latest             "step-<N>": the newest complete checkpoint, replaced atomically after each save
//   DIR/step-<N>.partial/  a save in progress; a crash leaves only this, removed by the next save
// A save writes everything into step-<N>.partial, syncs it, renames it to step-<N> and only then moves
// `latest`: a kill or a full disk at any point leaves the previous checkpoint complete and `latest` naming
// it. Readers (`--resume DIR`, `generate --checkpoint DIR`) resolve DIR through `latest`; a step directory
// (or an older flat checkpoint with manifest.json at the top) may be passed directly.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace expar {

std::string checkpoint_step_name(int64_t step);  // "step-<N>"

// The directory holding the checkpoint's manifest.json: DIR/<latest> when DIR/latest exists, else DIR
// itself when it holds manifest.json. Throws expar::Error naming DIR and what it lacks otherwise.
std::filesystem::path resolve_checkpoint_dir(const std::filesystem::path& dir);

// True when DIR holds a checkpoint (a `latest` pointer or a manifest.json).
bool holds_checkpoint(const std::filesystem::path& dir);

// Creates DIR if needed and checks that a file can be created in it (run before training, so that an
// unwritable DIR is found at the start, not after the first hours). `flag` names the option in messages.
void check_checkpoint_dir_writable(const std::filesystem::path& dir, const std::string& flag);

// The steps of DIR's complete step directories, ascending.
std::vector<int64_t> checkpoint_steps(const std::filesystem::path& dir);

// DIR/step-<N>.partial: where every writer of a save puts its files.
std::filesystem::path checkpoint_staging_dir(const std::filesystem::path& dir, int64_t step);

// Called by the one process that commits (rank 0) before any file of the save is written: creates DIR,
// removes what crashed saves left (step-*.partial directories, temporary files of `latest`) and returns an
// empty DIR/step-<N>.partial for the save's files.
std::filesystem::path begin_checkpoint_save(const std::filesystem::path& dir, int64_t step);

// After every file of the save is written and synced: syncs the staging directory, renames it to step-<N>
// (replacing an older save of the same step), points `latest` at it, then removes the oldest complete step
// directories so that at most `keep_last` remain (0: keep all) — or, with `remove_others`, every other step
// directory (a run that replaces a checkpoint of another model).
void commit_checkpoint_save(const std::filesystem::path& dir, int64_t step, int keep_last,
                            bool remove_others);

// What ties the files of one save together, stored in every safetensors file's __metadata__ and in the
// manifest: the step, an id unique to the save, and a hash of the model config.
struct CheckpointIdentity {
  int64_t step = 0;
  std::string save_id;     // empty in checkpoints written before save ids existed
  std::string model_hash;  // empty likewise
};
// Throws expar::Error naming `file` when its metadata do not match `expected` (a torn set: files from
// different saves or of a different model). Fields missing from `expected` are not compared.
void check_checkpoint_file_identity(const std::map<std::string, std::string>& metadata,
                                    const std::string& file, const CheckpointIdentity& expected,
                                    const std::string& manifest);
// A new id for one save (random, hex).
std::string new_save_id();
// A stable hash (FNV-1a 64, hex) of a text such as a model config's JSON.
std::string stable_hash(std::string_view text);

// True when `file` is a relative path without '..' (it stays inside the directory it is looked up in).
bool is_name_inside_directory(const std::string& file);

}  // namespace expar
