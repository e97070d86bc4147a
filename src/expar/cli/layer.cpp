// `expar layer`: one MoE layer forward and backward from a safetensors file, every output and gradient
// written to another (the tool to check a path against any other framework). Only parses and prints; the
// work is expar::run_layer_tool_file in model/layer_tool.hpp, where the tensor names are documented.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/precision_flags.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/cli/wave_flags.hpp"
#include "expar/core/error.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/model/layer_tool.hpp"
#include "expar/moe/capacity.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/router.hpp"

namespace expar::cli {

namespace {

struct LayerCliOptions {
  std::string input, output;
  LayerToolOptions tool;
  PrecisionFlags precision;
};

int run_layer(LayerCliOptions& o) {
  o.tool.precision = o.precision.parse();
  // Writing the output over the input would destroy the input (and the mapped view being read).
  std::error_code ec;
  EXPAR_CHECK(!std::filesystem::equivalent(o.input, o.output, ec) &&
                  std::filesystem::absolute(o.input) != std::filesystem::absolute(o.output),
              "--out '{}' is the input file '{}': writing it would overwrite the input; pass another --out",
              o.output, o.input);
  run_layer_tool_file(o.input, o.output, o.tool);
  const SafetensorsFile out = SafetensorsFile::open(o.output);
  fmt::print("expar layer: path {}, {} ranks, EP {}: wrote {} tensors to {} (drop rate {:.6f})\n",
             o.tool.path, o.tool.ranks, o.tool.ep, out.size(), o.output,
             out.view("metrics.drop_rate").data<double>()[0]);
  return 0;
}

}  // namespace

void add_layer(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand(
      "layer",
      "Run one MoE layer forward and backward from a safetensors file (x, gate.weight, "
      "experts.{e}.w1/w3/w2.weight, optional grad_y and tokens_per_rank) and write y, grad_x, grad.<weight>, "
      "topk_idx, topk_weight, route_dropped and metrics.* to --out");
  auto opts = std::make_shared<LayerCliOptions>();
  cmd->add_option("input", opts->input, "input safetensors file")->required();
  cmd->add_option("--out,-o", opts->output, "output safetensors file")->required();
  cmd->add_option("--ranks", opts->tool.ranks, "ranks (threads); x is split rank-major")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  cmd->add_option("--ranks-per-node", opts->tool.ranks_per_node,
                  "emulate nodes of this many ranks (a divisor of --ranks; default: all on one node)")
      ->check(integer_in(1, 1024));
  cmd->add_option("--ep", opts->tool.ep, "EP_MP degree M_E (a divisor of --ranks)")
      ->capture_default_str()
      ->check(integer_in(1, 1024));
  cmd->add_option("--path", opts->tool.path, "execution path: " + choices(path_names()))
      ->capture_default_str();
  add_experts_per_token_flag(cmd, opts->tool.top_k, "routes per token K", 1 << 20)->capture_default_str();
  cmd->add_option("--score", opts->tool.score, "router score function: " + choices(score_function_names()))
      ->capture_default_str()
      ->check(one_of(score_function_names()));
  cmd->add_flag("--renormalize", opts->tool.renormalize, "renormalize the K weights to sum to 1");
  cmd->add_option("--capacity-factor", opts->tool.capacity_factor, "expert capacity factor (0: dropless)")
      ->capture_default_str()
      ->check(finite_in(0, 1024));
  cmd->add_option("--capacity-policy", opts->tool.capacity_policy,
                  "capacity rule: " + choices(capacity_policy_names()))
      ->capture_default_str()
      ->check(one_of(capacity_policy_names()));
  add_precision_flags(cmd, opts->precision);
  add_wave_flags(cmd, opts->tool.waves);
  table[cmd] = [opts] { return run_layer(*opts); };
}

}  // namespace expar::cli
