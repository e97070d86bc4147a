// `expar bench paths`: options -> the bench layer (bench/paths.hpp measures every registered path and
// formats the phase table of seed 000 Table 7, the payload bytes and Table 6's memory); --json and --svg
// write the same figures.
#include <fmt/format.h>

#include <fstream>

#include "expar/bench/measure.hpp"
#include "expar/bench/paths.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/precision_flags.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"

namespace expar::cli {

namespace {

using namespace expar::bench;

}  // namespace

void add_bench_paths(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "paths",
      "Every execution path on identical inputs and routes: phase table (Table 7), limits, memory (Table 6)");
  auto o = std::make_shared<PathsBenchOptions>();
  auto json = std::make_shared<JsonOutput>();
  auto svg_path = std::make_shared<std::string>();
  auto no_memory = std::make_shared<bool>(false);
  auto precision = std::make_shared<PrecisionFlags>();
  add_layer_bench_flags(cmd, *o);
  auto* ranks = cmd->get_option("--ranks");
  cmd->add_option("--transport", o->transport,
                  "threads (ranks are threads of this process) | mpi (one rank per process, under mpirun; "
                  "rank 0 prints)")
      ->capture_default_str()
      ->check(one_of(transport_names()));
  cmd->add_option("--ep", o->ep, "EP degree (default: --ranks)")->check(integer_in(0, 256));
  cmd->add_option("--ranks-per-node", o->ranks_per_node,
                  "threads: emulate nodes of this many ranks (a divisor of --ranks; default: all on one "
                  "node): rows across nodes become counted messages (mpi: the real nodes)")
      ->check(integer_in(1, 256));
  auto* paths = cmd->add_option("--paths", o->paths,
                                "paths to run (default: every registered path that takes the precision)")
                    ->delimiter(',');
  cmd->add_flag("--no-memory", *no_memory, "skip the memory table");
  cmd->add_flag("--sync-comm", o->sync_comm,
                "barrier before each communication phase, shown as 'wait for peers' (phases then measure "
                "moving rows, not the slowest peer)");
  add_precision_flags(cmd, *precision);
  auto products = std::make_shared<std::string>("f32");
  cmd->add_option(
         "--precision", *products,
         "the grouped GEMM's products: f32 | bf16 (BF16 operands, f32 accumulation, from BF16 copies "
         "of the f32 weights; the matmul limit is then the same BF16 product; refused on CPUs "
         "without BF16 dot products)")
      ->capture_default_str()
      ->check(one_of({"f32", "bf16"}));
  cmd->add_option(
         "--router-skew", o->router_skew,
         "Zipf exponent s of a bias added to the router's logits (expert popularity ~ 1/rank^s, real "
         "models measure about 1; 0: none)")
      ->capture_default_str()
      ->check(finite_in(0, 16));
  cmd->add_option("--redundant-experts", o->redundant_experts,
                  "R extra expert slots over each EP group (S = E + R, S/EP per rank), replicas placed by "
                  "EPLB from the routes of another batch")
      ->capture_default_str()
      ->check(integer_in(0, 1 << 12));
  add_json_option(cmd, *json, "the figures");
  cmd->add_option("--svg", *svg_path, "also write a Figure 17-style chart to this file");
  table[cmd] = [o, json, svg_path, no_memory, precision, paths, ranks, products] {
    o->precision = precision->parse();
    o->bf16_products = *products == "bf16";
    if (paths->count() == 0) o->paths = benchmarked_paths(o->precision);
    EXPAR_CHECK(
        o->transport == "threads" || ranks->count() == 0,
        "--ranks {} with --transport mpi: the ranks are the MPI processes; leave --ranks out and start "
        "them with scripts/mpirun-local -n R (or scripts/mpirun-nodes N_NODES RANKS_PER_NODE)",
        o->ranks);
    // Every rank measures (the figures are reduced over all of them); world rank 0 prints and writes.
    run_on_ranks(*o, [&](Comm& world, const PathsBenchOptions& run) {
      const bool prints = world.rank() == 0 && json->table_wanted();
      const PathsReport report = measure_paths(world, run);
      if (prints) fmt::print("{}", format_paths_table(report));
      std::vector<MemoryRow> memory;
      if (!*no_memory) {
        memory = measure_memory(world, run);
        if (prints) fmt::print("{}", format_memory_table(memory));
      }
      if (world.rank() != 0) return;
      json->write(paths_json(report, memory));
      if (!svg_path->empty()) write_text_file(*svg_path, paths_svg(report));
    });
    return 0;
  };
}

}  // namespace expar::cli
