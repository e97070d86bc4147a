#pragma once
// The measurements behind `expar bench paths`, `expar bench bar` and `expar bench scaling` (the bench layer:
// cli only parses options and calls these): every execution
// path on identical inputs, weights and routes, timed phase by phase (seed 000 Table 7) with the machine's
// own limits (oneDNN matmul FLOP/s, memcpy bandwidth) measured in the same run, and the per-rank peak
// memory of one MoE layer training step by category with and without EP (Table 6).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "expar/bench/layer_bench.hpp"
#include "expar/comm/comm.hpp"
#include "expar/core/memory.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/moe/payload_precision.hpp"

namespace expar::bench {

// The registered paths a benchmark runs at this precision (moe/paths registry: every path but decode forms;
// with a reduced precision only those that take it).
std::vector<std::string> benchmarked_paths(const PayloadPrecision& precision);

struct PathsBenchOptions : LayerBenchSetup {
  int ep = 0;              // EP degree (0: = ranks)
  int ranks_per_node = 0;  // emulated nodes (LaunchOptions::ranks_per_node; 0: one node); threads only
  // "threads": the ranks are threads of this process; "mpi": one rank per process under mpirun, whose world
  // gives the ranks (`ranks` is set to its size) and the nodes (MPI_COMM_TYPE_SHARED).
  std::string transport = "threads";
  // Barrier before every communication phase, booked as "wait for peers" (phase::kWait), so that the
  // communication phases measure moving rows and not the slowest peer.
  bool sync_comm = false;
  std::vector<std::string> paths = benchmarked_paths({});
  // Payload format of each row movement; a reduced one runs the paths that encode rows only (the memory
  // table's no-EP column stays f32: the local path encodes nothing).
  PayloadPrecision precision;
  // --precision bf16: the grouped GEMM's products in BF16 with f32 accumulation (the experts' BF16 copies of
  // their f32 masters, moe/expert_mlp.hpp), and the matmul limit the same BF16 product (core/matmul.hpp's
  // matmul_bf16) at the same shapes. Refused by name on CPUs without BF16 dot products (validate).
  bool bf16_products = false;
  // --router-skew s: a Zipf-like bias on the router's logits (moe/router_skew.hpp, from s, E and `seed`),
  // the layer's router bias; 0: none.
  double router_skew = 0;
  // --redundant-experts R: E + R expert slots over each EP group, placed by DeepSeek's EPLB
  // (topo/expert_balance.hpp) from the loads the router gives another batch of the same inputs' distribution
  // (measured_expert_slots); the single-rank paths keep one slot per expert.
  int redundant_experts = 0;
};

// Throws expar::Error for a bad shape, an unknown path, emulated nodes under MPI, or ranks x threads above
// the cores without oversubscribe (under MPI: the ranks on this rank's node, `local_ranks`; 0: o.ranks).
void validate(const PathsBenchOptions& o, int local_ranks = 0);

// The slot table of o.redundant_experts > 0 (MoeExecution::slots), empty for 0: every rank routes a batch
// drawn like its timed inputs but from another stream, the routes per expert are summed over the world and
// EPLB places E + R slots over the EP group by them. Collective over `world`; the same table on every rank.
std::vector<int> measured_expert_slots(Comm& world, const PathsBenchOptions& o);

// The benchmark's MoE layer for `path` on `group` with `slots` (empty: one slot per expert), its parameters
// initialised from o.seed (layout-independent) with the router skew's bias and, with --precision bf16, the
// experts' BF16 copies. `heap`: the rowwise path's (null: its own).
std::unique_ptr<MoeLayer> make_bench_layer(Comm& group, const PathsBenchOptions& o, const std::string& path,
                                           const std::vector<int>& slots, SymmetricHeap* heap = nullptr);

// One pass (forward or backward) of one path: per phase the median over repeats of the max over ranks.
struct PassTimes {
  std::vector<std::pair<std::string, double>> phases;  // display order
  double total = 0.0;  // median over repeats of the max over ranks of the whole pass (wall, barrier to end)
  double phase_seconds(const std::string& name) const;
  // Everything except the router, the grouped GEMM and the waits of --sync-comm: what the path (and its
  // route map) costs.
  double dispatch_combine() const;
};

struct PathResult {
  std::string path;
  PassTimes forward, backward;
  // Per phase: bytes read + written (max over ranks) by the forward phase and by its backward adjoint (the
  // adjoint of a gather-and-sum reads fewer rows than the forward scatter writes, so they differ).
  std::map<std::string, double> bytes;
  std::map<std::string, double> bytes_backward;
  const std::map<std::string, double>& bytes_of(bool forward) const {
    return forward ? bytes : bytes_backward;
  }
  // Rows this rank's routes move per leg (accepted routes sent, max over ranks) and the bytes they carry
  // in each leg's payload format: dispatch, combine, combine backward, dispatch backward.
  int64_t routes_moved = 0;
  double payload_bytes[4] = {0, 0, 0, 0};
  double gemm_flops_forward = 0.0;  // max over ranks
  double gemm_flops_backward = 0.0;
  // The grouped GEMM's limit: FLOP/s of one oneDNN matmul [matmul_rows, d]·[d, h] (this path's expert rows,
  // max over ranks; every rank at once), timed after each of this path's repeats, median; with
  // bf16_products the BF16 product the grouped GEMM runs (matmul_bf16), else the f32 one (matmul).
  double matmul_flops = 0.0;
  int64_t matmul_rows = 0;
  // Messages and bytes of one step (forward + backward), summed over all ranks, within and across nodes:
  // the EP group's collectives (Comm::stats().traffic) and the one-sided puts and gets on its heap
  // (SymmetricHeap::stats()). Deterministic for given routes, unlike the times.
  TrafficStats collective_traffic, one_sided_traffic;
  // The experts' load per EP rank: (max - mean) / mean over the group's ranks of the rows its experts
  // computed (max over EP groups; 0 on one rank).
  double rank_load_imbalance = 0.0;
  double step() const { return forward.total + backward.total; }
};

struct Limits {
  double matmul_flops = 0.0;  // FLOP/s of one oneDNN matmul [rows, d] x [d, h] per rank, all ranks at once
  int64_t matmul_rows = 0;
  double memcpy_bandwidth = 0.0;  // bytes read + written per second per rank, all ranks at once
  int64_t memcpy_bytes = 0;
};

struct PathsReport {
  PathsBenchOptions options;
  NodeMap nodes;  // of the world the paths ran on: emulated (threads) or MPI's
  Limits limits;
  std::vector<PathResult> results;
  const PathResult* find(const std::string& path) const;
};

// Runs fn(world, run) on every rank of o.transport: threads of this process (o.ranks of them on
// o.ranks_per_node emulated nodes), or this process's rank of the MPI world (under mpirun). `run` is o with
// ranks = the world's size, validated. Under MPI only world rank 0 should print.
void run_on_ranks(const PathsBenchOptions& o,
                  const std::function<void(Comm& world, const PathsBenchOptions& run)>& fn);

// Collective over `world` (o validated, o.ranks = world.size()): every rank returns the same report, its
// figures reduced over all ranks.
PathsReport measure_paths(Comm& world, const PathsBenchOptions& o);
// The same on the ranks of o.transport (run_on_ranks); under MPI each process returns the report.
PathsReport measure_paths(const PathsBenchOptions& o);

// Table 6: peak per-rank bytes by category of one MoE layer training step (forward + backward, parameters
// and gradients allocated), max over ranks.
struct MemoryRow {
  std::string label;
  int ranks = 1;
  MemorySnapshot peak;  // per category and total: max over ranks of the peak
};
// Collective over `world`, as measure_paths: each row runs on the ranks it needs (no EP: world rank 0; EP:
// the EP group of world rank 0), each rank counting into a tracker of its own for that row.
std::vector<MemoryRow> measure_memory(Comm& world, const PathsBenchOptions& o);
std::vector<MemoryRow> measure_memory(const PathsBenchOptions& o);

// Phase kinds for limits and the chart.
enum class PhaseKind { Router, RouteMap, Layout, Collective, Rowwise, Compute, Wait };
PhaseKind phase_kind(const std::string& name);

std::string format_paths_table(const PathsReport& report);
std::string format_memory_table(const std::vector<MemoryRow>& rows);
// The MESSAGES table of format_paths_table (traffic within and across nodes per path).
std::string format_traffic(const PathsReport& report);
std::string paths_json(const PathsReport& report, const std::vector<MemoryRow>& memory);
std::string paths_svg(const PathsReport& report);

// The matmul FLOP/s a path's grouped GEMM is compared with: its own (PathResult::matmul_flops), else the
// run's (Limits::matmul_flops).
double gemm_limit(const PathsReport& report, const PathResult& r);

// Fraction of the limit a phase reached: ideal time at the limit / measured time (0 when not applicable).
double limit_fraction(const PathsReport& report, const PathResult& r, const std::string& phase, bool forward);

}  // namespace expar::bench
