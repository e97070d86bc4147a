// `expar bench waves`: options -> bench/waves.hpp (the real MoE layer under its no-wave, wave-sequential
// and wave-overlapped schedules, eq. 10 for forward and backward).
#include <fmt/format.h>

#include "expar/bench/measure.hpp"
#include "expar/bench/waves.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"

namespace expar::cli {

void add_bench_waves(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "waves",
      "The MoE layer under no-wave, wave-sequential and wave-overlapped schedules: T_comm, T_gemm, stretch, "
      "eq. 10, forward and backward");
  auto o = std::make_shared<bench::WavesBenchOptions>();
  auto json = std::make_shared<JsonOutput>();
  cmd->add_option("--ranks", o->ranks, "ranks (threads of this process; EP over all of them)")
      ->check(integer_in(1, 256));
  cmd->add_option("--threads", o->threads, "compute (oneDNN) threads per rank; the comm thread is extra")
      ->check(integer_in(1, 256));
  cmd->add_option("--tokens", o->tokens, "tokens per rank")->check(integer_in(1, 1 << 20));
  add_layer_shape_flags(cmd, o->model_dim, o->hidden_dim, o->experts, o->top_k);
  cmd->add_option("--path", o->path, "execution path (one that runs waves: block | rowwise)");
  cmd->add_option("--waves", o->waves, "wave counts, each in [2, E / ranks] (no-wave always runs)")
      ->delimiter(',')
      ->check(integer_in(2, 4096));
  cmd->add_option("--repeats", o->repeats, "measured repeats (the median is shown)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", o->warmup, "warm-up repeats before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--seed", o->seed, "seed of inputs and weights");
  cmd->add_flag("--oversubscribe", o->oversubscribe, "allow ranks x threads above the cores");
  add_json_option(cmd, *json, "the figures");
  table[cmd] = [o, json] {
    const bench::WavesReport report = bench::measure_waves(*o);
    if (json->table_wanted()) fmt::print("{}", bench::format_waves_table(report));
    json->write(bench::waves_json(report));
    return 0;
  };
}

}  // namespace expar::cli
