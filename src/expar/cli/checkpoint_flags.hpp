#pragma once
// The checkpoint a command reads, defined once for `expar generate`, `expar eval`, `expar serve`,
// `expar bench generate` and `expar bench serve`: --checkpoint (the directory expar train writes, or a
// Hugging Face checkpoint directory or a file in one) and --format (its layout, auto: detected). --path,
// the checkpoint's old name in some of them, is the execution path in every other command: here it is
// refused with the new spelling.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "expar/model/architecture.hpp"

namespace expar::cli {

struct CheckpointArgs {
  std::string dir;  // a run directory (its `latest`), a step directory, or a file in a checkpoint
  std::string format = "auto";
  // The format --format names; nullopt for auto (detected from manifest.json / config.json's model_type).
  std::optional<ModelFormat> model_format() const;
};

// --checkpoint (required), --format, and the refusal of the old --path.
void add_checkpoint_options(CLI::App* cmd, CheckpointArgs& a);

}  // namespace expar::cli
