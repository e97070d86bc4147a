// `expar bench comm` (bench/comm.hpp measures; this file launches the ranks and prints): put/get and
// all_to_all_v bandwidth of the threads or MPI backend beside memcpy. Under MPI, run it with
// scripts/mpirun-local -n N.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "expar/bench/comm.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"

namespace expar::cli {

namespace {

struct BenchOptions {
  std::string backend = "threads";
  int ranks = 2;
  int repeats = 7;
  size_t bytes_per_rank = size_t{4} << 20;
};

void print_comm(const bench::CommBandwidth& r, const std::string& label, int ranks, int repeats) {
  fmt::print("expar bench comm: backend {}, {} ranks, {} per rank per transfer, median of {} repeats\n",
             label, ranks, format_bytes(static_cast<int64_t>(r.bytes_per_rank)), repeats);
  fmt::print("{:>10} {:>8} {:>12} {:>12} {:>12}\n", "row bytes", "rows", "put GB/s", "get GB/s",
             "memcpy GB/s");
  for (const bench::CommRowSize& s : r.row_sizes)
    fmt::print("{:>10} {:>8} {:>12.2f} {:>12.2f} {:>12.2f}\n", s.row_bytes, s.rows, s.put_gbps, s.get_gbps,
               s.memcpy_gbps);
  fmt::print("all_to_all_v {} per rank: {:.2f} GB/s (memcpy of the same bytes: {:.2f} GB/s)\n",
             format_bytes(static_cast<int64_t>(r.all_to_all_bytes)), r.all_to_all_gbps,
             r.all_to_all_memcpy_gbps);
}

void bench_comm(Comm& world, const BenchOptions& o, const std::string& label) {
  const bench::CommBandwidth r = bench::measure_comm_bandwidth(world, o.bytes_per_rank, o.repeats);
  if (world.rank() == 0) print_comm(r, label, world.size(), o.repeats);
}

int run_bench_comm(const BenchOptions& o) {
  LaunchOptions launch;
  launch.ranks = o.ranks;
  launch.compute_threads = 1;
  if (o.backend == "threads") {
    run_ranks(launch, [&](Comm& world) { bench_comm(world, o, "threads"); });
    return 0;
  }
  if (o.backend == "mpi") {
    const char* force = std::getenv("EXPAR_MPI_FORCE_REMOTE");
    const std::string label =
        force && std::string(force) == "1" ? "mpi (EXPAR_MPI_FORCE_REMOTE=1: MPI_Put/MPI_Get)" : "mpi";
    return run_mpi(nullptr, nullptr, launch, [&](Comm& world) { bench_comm(world, o, label); });
  }
  fail("--transport {}: unknown transport; use threads or mpi", o.backend);
}

}  // namespace

// Subcommands in bench_*.cpp files.
void add_bench_paths(CLI::App* bench, CommandTable& table);
void add_bench_bar(CLI::App* bench, CommandTable& table);
void add_bench_payload(CLI::App* bench, CommandTable& table);
void add_bench_waves(CLI::App* bench, CommandTable& table);
void add_bench_tokenize(CLI::App* bench, CommandTable& table);
void add_bench_serve(CLI::App* bench, CommandTable& table);
void add_bench_generate(CLI::App* bench, CommandTable& table);

void add_bench(CLI::App& app, CommandTable& table) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto* comm = bench->add_subcommand("comm", "Put/get and all_to_all_v bandwidth of a communication backend");
  auto o = std::make_shared<BenchOptions>();
  // --transport, as on expar train and serve.
  comm->add_option("--transport", o->backend,
                   "threads (ranks are threads) or mpi (run under scripts/mpirun-local)")
      ->check(one_of(transport_names()));
  retire_option(comm, "--backend", "--transport", "the transport is --transport in every command");
  comm->add_option("--ranks", o->ranks, "ranks for the threads backend (mpi: the mpirun -n)")
      ->check(integer_in(1, 256));
  comm->add_option("--repeats", o->repeats, "repeats per figure (the median is printed)")
      ->check(integer_in(1, 1000));
  comm->add_option("--bytes", o->bytes_per_rank, "bytes each rank moves per transfer")
      ->check(integer_in(65536, int64_t{1} << 32));
  table[comm] = [o] { return run_bench_comm(*o); };
  add_bench_paths(bench, table);
  add_bench_bar(bench, table);
  add_bench_payload(bench, table);
  add_bench_waves(bench, table);
  add_bench_tokenize(bench, table);
  add_bench_serve(bench, table);
  add_bench_generate(bench, table);
}

}  // namespace expar::cli
