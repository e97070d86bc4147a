// `expar bench comm`: put/get bandwidth for row-sized transfers (256 B .. 64 KiB) and all_to_all_v bandwidth
// on the threads or MPI backend, beside memcpy bandwidth measured in the same run on the same pattern, each
// the median of several repeats. Under MPI, run it with scripts/mpirun-local -n N.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "expar/bench/measure.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/comm/symmetric_heap.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/core/timer.hpp"

namespace expar::cli {

namespace {

struct BenchOptions {
  std::string backend = "threads";
  int ranks = 2;
  int repeats = 7;
  size_t bytes_per_rank = size_t{4} << 20;
};

using bench::median;
using bench::timed_max;

double gbps(size_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

void bench_comm(Comm& world, const BenchOptions& o, const std::string& label) {
  const int n = world.size(), me = world.rank();
  const size_t total = o.bytes_per_rank;
  auto heap = world.make_heap();
  BufferId buf = heap->allocate("bench", total);
  std::vector<std::byte> src(total, std::byte{1}), dst(total);
  const int peer = (me + 1) % n;
  if (me == 0) {
    fmt::print("expar bench comm: backend {}, {} ranks, {} per rank per transfer, median of {} repeats\n",
               label, n, format_bytes(static_cast<int64_t>(total)), o.repeats);
    fmt::print("{:>10} {:>8} {:>12} {:>12} {:>12}\n", "row bytes", "rows", "put GB/s", "get GB/s",
               "memcpy GB/s");
  }
  for (size_t row = 256; row <= 65536; row *= 4) {
    const size_t rows = total / row;
    // Rows land at shuffled offsets, as token rows do in dispatch.
    std::vector<size_t> order(rows);
    std::iota(order.begin(), order.end(), size_t{0});
    for (size_t i = rows - 1; i > 0; --i) std::swap(order[i], order[random_u32(7, 1, i) % (i + 1)]);
    std::vector<double> put_s, get_s, copy_s;
    for (int rep = 0; rep < o.repeats; ++rep) {
      put_s.push_back(timed_max(world, [&] {
        for (size_t i = 0; i < rows; ++i) heap->put(peer, buf, order[i] * row, src.data() + i * row, row);
        heap->quiet();
        heap->barrier();
      }));
      get_s.push_back(timed_max(world, [&] {
        for (size_t i = 0; i < rows; ++i) heap->get(peer, buf, order[i] * row, dst.data() + i * row, row);
        heap->quiet();
      }));
      copy_s.push_back(timed_max(world, [&] {
        auto* local = static_cast<std::byte*>(heap->local(buf));
        for (size_t i = 0; i < rows; ++i) std::memcpy(local + order[i] * row, src.data() + i * row, row);
      }));
    }
    if (me == 0)
      fmt::print("{:>10} {:>8} {:>12.2f} {:>12.2f} {:>12.2f}\n", row, rows, gbps(total, median(put_s)),
                 gbps(total, median(get_s)), gbps(total, median(copy_s)));
  }
  // all_to_all_v: an even split of the same volume to every member (f32 elements).
  const size_t elems = total / 4 / static_cast<size_t>(n);
  std::vector<size_t> counts(static_cast<size_t>(n), elems);
  std::vector<float> send(elems * static_cast<size_t>(n), 1.0f), recv(elems * static_cast<size_t>(n));
  std::vector<double> a2a_s, copy_s;
  for (int rep = 0; rep < o.repeats; ++rep) {
    a2a_s.push_back(
        timed_max(world, [&] { world.all_to_all_v(send.data(), counts, recv.data(), counts, DType::F32); }));
    copy_s.push_back(
        timed_max(world, [&] { std::memcpy(recv.data(), send.data(), send.size() * sizeof(float)); }));
  }
  const size_t moved = send.size() * sizeof(float);
  if (me == 0)
    fmt::print("all_to_all_v {} per rank: {:.2f} GB/s (memcpy of the same bytes: {:.2f} GB/s)\n",
               format_bytes(static_cast<int64_t>(moved)), gbps(moved, median(a2a_s)),
               gbps(moved, median(copy_s)));
  heap->barrier();
}

int run_bench_comm(const BenchOptions& o) {
  EXPAR_CHECK(o.repeats >= 1, "--repeats {}: use at least 1", o.repeats);
  EXPAR_CHECK(o.bytes_per_rank >= 65536, "--bytes {}: use at least 65536 (one 64 KiB row)", o.bytes_per_rank);
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
