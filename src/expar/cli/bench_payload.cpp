// `expar bench payload`: options -> bench/payload.hpp (the product's block and rowwise paths moving f32,
// bf16 and MXFP8 rows, side by side).
#include <fmt/format.h>

#include "expar/bench/measure.hpp"
#include "expar/bench/payload.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"

namespace expar::cli {

void add_bench_payload(CLI::App* bench, CommandTable& table) {
  auto* cmd =
      bench->add_subcommand("payload",
                            "The block, rowwise and aggregated paths moving f32, bf16 and MXFP8 "
                            "payloads: bytes per leg and dispatch + combine time, forward and backward");
  auto o = std::make_shared<bench::PayloadBenchOptions>();
  auto json = std::make_shared<JsonOutput>();
  LayerBenchHelp help;
  help.ranks = "ranks (threads of this process; EP over all of them)";
  help.d = "row width d (a multiple of 32 for the MX formats)";
  help.h = "expert hidden dimension (the GEMM is not measured here)";
  add_layer_bench_flags(cmd, *o, help);
  cmd->add_option("--formats", o->formats, "payload formats (f32 always runs first: the reference)")
      ->delimiter(',');
  add_json_option(cmd, *json, "the figures");
  table[cmd] = [o, json] {
    const bench::PayloadReport report = bench::measure_payload(*o);
    if (json->table_wanted()) fmt::print("{}", bench::format_payload_table(report));
    json->write(bench::payload_json(report));
    return 0;
  };
}

}  // namespace expar::cli
