// `expar bench payload`: options -> bench/payload.hpp (the product's block and rowwise paths moving f32,
// bf16 and MXFP8 rows, side by side).
#include <fmt/format.h>

#include "expar/bench/measure.hpp"
#include "expar/bench/payload.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"

namespace expar::cli {

void add_bench_payload(CLI::App* bench, CommandTable& table) {
  auto* cmd =
      bench->add_subcommand("payload",
                            "The block, rowwise and aggregated paths moving f32, bf16 and MXFP8 "
                            "payloads: bytes per leg and dispatch + combine time, forward and backward");
  auto o = std::make_shared<bench::PayloadBenchOptions>();
  auto json_path = std::make_shared<std::string>();
  cmd->add_option("--ranks", o->ranks, "ranks (threads of this process; EP over all of them)")
      ->check(integer_in(1, 256));
  cmd->add_option("--threads", o->threads, "compute threads per rank")->check(integer_in(1, 256));
  cmd->add_option("--tokens", o->tokens, "tokens per rank")->check(integer_in(1, 1 << 20));
  add_layer_shape_flags(cmd, o->model_dim, o->hidden_dim, o->experts, o->top_k,
                        "row width d (a multiple of 32 for the MX formats)",
                        "expert hidden dimension (the GEMM is not measured here)");
  cmd->add_option("--repeats", o->repeats, "measured repeats (the median is shown)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", o->warmup, "warm-up repeats before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--seed", o->seed, "seed of inputs and weights");
  cmd->add_option("--formats", o->formats, "payload formats (f32 always runs first: the reference)")
      ->delimiter(',');
  cmd->add_flag("--oversubscribe", o->oversubscribe, "allow ranks x threads above the cores");
  cmd->add_option("--json", *json_path, "also write the figures as JSON to this file");
  table[cmd] = [o, json_path] {
    const bench::PayloadReport report = bench::measure_payload(*o);
    fmt::print("{}", bench::format_payload_table(report));
    if (!json_path->empty()) bench::write_text_file(*json_path, bench::payload_json(report));
    return 0;
  };
}

}  // namespace expar::cli
