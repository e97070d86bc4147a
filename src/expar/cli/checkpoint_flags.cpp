#include "expar/cli/checkpoint_flags.hpp"

#include "expar/cli/option_checks.hpp"

namespace expar::cli {

std::optional<ModelFormat> CheckpointArgs::model_format() const {
  return format == "auto" ? std::nullopt : std::optional(model_format_from_name(format));
}

void add_checkpoint_options(CLI::App* cmd, CheckpointArgs& a) {
  cmd->add_option("--checkpoint", a.dir,
                  "Checkpoint directory (expar train's run directory or a Hugging Face one) or a file in one "
                  "(manifest.json, config.json, *.safetensors[.index.json])")
      ->required();
  std::vector<std::string> formats = {"auto"};
  for (const std::string& name : model_format_names()) formats.push_back(name);
  cmd->add_option("--format", a.format, "Checkpoint format (auto: detected): " + choices(formats))
      ->capture_default_str()
      ->check(one_of(formats));
  retire_option(cmd, "--path", "--checkpoint",
                "--path is the execution path (expar train, layer, plan, bench); the checkpoint to read is "
                "--checkpoint");
}

}  // namespace expar::cli
