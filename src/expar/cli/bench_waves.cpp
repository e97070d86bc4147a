// `expar bench waves`: options -> bench/waves.hpp (the real MoE layer under its no-wave, wave-sequential
// and wave-overlapped schedules, eq. 10 for forward and backward).
#include <fmt/format.h>

#include "expar/bench/measure.hpp"
#include "expar/bench/waves.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/moe/paths/path.hpp"

namespace expar::cli {

void add_bench_waves(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "waves",
      "The MoE layer under no-wave, wave-sequential and wave-overlapped schedules: T_comm, T_gemm, stretch, "
      "eq. 10, forward and backward");
  auto o = std::make_shared<bench::WavesBenchOptions>();
  auto json = std::make_shared<JsonOutput>();
  LayerBenchHelp help;
  help.ranks = "ranks (threads of this process; EP over all of them)";
  help.threads = "compute (oneDNN) threads per rank; the comm thread is extra";
  add_layer_bench_flags(cmd, *o, help);
  cmd->add_option("--path", o->path,
                  "execution path (one that runs waves): " + choices(path_names_with(&PathTraits::waves)))
      ->capture_default_str();
  cmd->add_option("--waves", o->waves, "wave counts, each in [2, E / ranks] (no-wave always runs)")
      ->delimiter(',')
      ->check(integer_in(2, 4096));
  add_json_option(cmd, *json, "the figures");
  table[cmd] = [o, json] {
    const bench::WavesReport report = bench::measure_waves(*o);
    if (json->table_wanted()) fmt::print("{}", bench::format_waves_table(report));
    json->write(bench::waves_json(report));
    return 0;
  };
}

}  // namespace expar::cli
