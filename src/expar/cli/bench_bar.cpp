// `expar bench bar`: the performance bar at one shape, each line with the measured value, the target and
// PASS/MISS with its margin. Two launches: 2 ranks x 1 compute thread (EP 2: block and rowwise) and
// 1 rank x 2 compute threads with twice the tokens (the same work without EP: local).
// `expar bench scaling`: time per token per phase over EP degrees and tokens per rank.
#include <fmt/format.h>

#include "expar/bench/paths.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/cli/shape_flags.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar::cli {

namespace {

using namespace expar::bench;

// Fixed launches (bar) or a list of them (scaling): no --ranks; --threads where the subcommand says.
void add_shape_options(CLI::App* cmd, PathsBenchOptions& o, const std::string& threads_help) {
  LayerBenchHelp help;
  help.ranks.clear();
  help.threads = threads_help;
  help.tokens = "tokens per rank (EP run; the no-EP run gets ranks x tokens)";
  add_layer_bench_flags(cmd, o, help);
}

// Achieved fraction of the GEMM limit over forward + backward.
double gemm_fraction(const PathsReport& report, const PathResult& r) {
  const double t =
      r.forward.phase_seconds(phase::kGroupedGemm) + r.backward.phase_seconds(phase::kGroupedGemm);
  return (r.gemm_flops_forward + r.gemm_flops_backward) / gemm_limit(report, r) / t;
}

// Achieved fraction of memcpy bandwidth over the data-movement phases of dispatch and combine, fwd + bwd.
double movement_fraction(const PathsReport& report, const PathResult& r) {
  double ideal = 0.0, measured = 0.0;
  for (bool forward : {true, false})
    for (const auto& [name, seconds] : (forward ? r.forward : r.backward).phases) {
      const PhaseKind k = phase_kind(name);
      if (k != PhaseKind::Layout && k != PhaseKind::Collective && k != PhaseKind::Rowwise) continue;
      const auto& bytes = r.bytes_of(forward);
      auto it = bytes.find(name);
      if (it == bytes.end()) continue;
      ideal += it->second / report.limits.memcpy_bandwidth;
      measured += seconds;
    }
  return measured > 0.0 ? ideal / measured : 0.0;
}

double dispatch_combine(const PathResult& r) {
  return r.forward.dispatch_combine() + r.backward.dispatch_combine();
}

struct Bar {
  std::string name;
  double value = 0.0, target = 0.0;
  bool at_least = true;  // value >= target passes; otherwise value <= target passes
  std::string unit;
};

// Prints the bar's line; returns whether it passed.
bool print_bar(const Bar& b) {
  const bool pass = b.at_least ? b.value >= b.target : b.value <= b.target;
  // Margin: how far past (+) or short of (-) the target, relative to the target.
  const double margin = (b.at_least ? b.value - b.target : b.target - b.value) / b.target;
  fmt::print("  {:<62} {:>8.3f}{:<2} {:>2} {:>6.3f}{:<2}  {:<4} margin {:+.1f}%\n", b.name, b.value, b.unit,
             b.at_least ? ">=" : "<=", b.target, b.unit, pass ? "PASS" : "MISS", 100.0 * margin);
  return pass;
}

// strict: the exit status is 1 when a bar is missed (for scripts and CI), otherwise always 0.
int run_bar(const PathsBenchOptions& base, bool strict) {
  PathsBenchOptions ep = base;
  ep.sync_comm = true;  // dispatch and combine measured apart from waiting for the slowest peer
  ep.ranks = 2;
  ep.ep = 2;
  ep.threads = 1;
  ep.paths = {"block", "rowwise"};
  PathsBenchOptions dense = base;
  dense.ranks = 1;
  dense.ep = 1;
  dense.threads = 2;
  dense.tokens = base.tokens * 2;
  dense.paths = {"local"};
  dense.sync_comm = true;
  validate(ep);
  validate(dense);
  const PathsReport a = measure_paths(ep);
  fmt::print("{}\n", format_paths_table(a));
  const PathsReport b = measure_paths(dense);
  fmt::print("{}\n", format_paths_table(b));
  const PathResult& block = *a.find("block");
  const PathResult& rowwise = *a.find("rowwise");
  const PathResult& local = *b.find("local");
  fmt::print("PERFORMANCE BAR (T={} tokens/rank, d={}, h={}, E={}, top-{})\n", base.tokens, base.model_dim,
             base.hidden_dim, base.experts, base.top_k);
  std::vector<Bar> bars = {
      {"grouped GEMM fwd+bwd / oneDNN matmul FLOP/s, 2 ranks x 1 thread", gemm_fraction(a, rowwise), 0.85,
       true, ""},
      {"grouped GEMM fwd+bwd / oneDNN matmul FLOP/s, 1 rank x 2 threads", gemm_fraction(b, local), 0.85, true,
       ""},
      {"rowwise dispatch+combine / block dispatch+combine (fwd+bwd)",
       dispatch_combine(rowwise) / dispatch_combine(block), 0.8, false, ""},
      {"rowwise dispatch+combine bytes / memcpy bandwidth", movement_fraction(a, rowwise), 0.6, true, ""},
      {"block dispatch+combine bytes / memcpy bandwidth", movement_fraction(a, block), 0.6, true, ""},
      {"EP step rowwise (2x1) / no-EP step local (1x2, same work)", rowwise.step() / local.step(), 1.10,
       false, ""},
      {"EP step block (2x1) / no-EP step local (1x2, same work)", block.step() / local.step(), 1.10, false,
       ""},
  };
  int missed = 0;
  for (const auto& bar : bars) missed += print_bar(bar) ? 0 : 1;
  fmt::print("{} of {} bars missed{}\n", missed, bars.size(),
             missed > 0 && strict ? ": exit status 1 (--strict)" : "");
  return strict && missed > 0 ? 1 : 0;
}

int run_scaling(const PathsBenchOptions& base, const std::vector<int>& eps,
                const std::vector<int64_t>& tokens) {
  fmt::print(
      "expar bench scaling: microseconds per token (this rank's tokens) per phase, forward + backward; d={}, "
      "h={}, E={}, top-{}, {} compute thread(s) per rank\n",
      base.model_dim, base.hidden_dim, base.experts, base.top_k, base.threads);
  for (int ep : eps)
    for (int64_t t : tokens) {
      PathsBenchOptions o = base;
      o.ranks = ep;
      o.ep = ep;
      o.tokens = t;
      o.paths.clear();
      for (const auto& p : base.paths)
        if (!path_traits(p).single_rank || ep == 1) o.paths.push_back(p);
      const PathsReport r = measure_paths(o);
      fmt::print("\nEP {} ({} ranks), T={} tokens/rank\n  {:<30}", ep, ep, t, "phase");
      for (const auto& res : r.results) fmt::print("{:>12}", res.path);
      fmt::print("\n");
      std::vector<std::string> names;
      for (const auto& res : r.results)
        for (const auto& [n, s] : res.forward.phases)
          if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      const double per = 1e6 / static_cast<double>(t);
      for (const auto& n : names) {
        fmt::print("  {:<30}", n);
        for (const auto& res : r.results) {
          const double s = res.forward.phase_seconds(n) + res.backward.phase_seconds(n);
          fmt::print("{:>12}", s > 0.0 ? fmt::format("{:.3f}", s * per) : "-");
        }
        fmt::print("\n");
      }
      fmt::print("  {:<30}", "step");
      for (const auto& res : r.results) fmt::print("{:>12.3f}", res.step() * per);
      fmt::print("\n");
    }
  return 0;
}

}  // namespace

void add_bench_bar(CLI::App* bench, CommandTable& table) {
  auto* bar = bench->add_subcommand(
      "bar",
      "The performance bar: GEMM efficiency, rowwise vs block, bytes vs memcpy, EP vs no EP (PASS/MISS)");
  auto o = std::make_shared<PathsBenchOptions>();
  auto strict = std::make_shared<bool>(false);
  add_shape_options(bar, *o, "");
  bar->add_flag("--strict", *strict, "exit with status 1 when a bar is missed");
  table[bar] = [o, strict] { return run_bar(*o, *strict); };

  auto* scaling =
      bench->add_subcommand("scaling", "Time per token per phase over EP degrees and tokens per rank");
  auto s = std::make_shared<PathsBenchOptions>();
  auto eps = std::make_shared<std::vector<int>>(std::vector<int>{1, 2});
  auto tokens = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{256, 1024, 4096, 16384});
  s->paths = {"local", "block", "rowwise"};
  add_shape_options(scaling, *s, "compute threads per rank");
  scaling->add_option("--ep-list", *eps, "EP degrees (ranks = EP degree)")
      ->delimiter(',')
      ->check(integer_in(1, 256));
  scaling->add_option("--tokens-list", *tokens, "tokens per rank")
      ->delimiter(',')
      ->check(integer_in(1, 1 << 20));
  scaling->add_option("--paths", s->paths, "paths (local runs at EP 1 only)")->delimiter(',');
  table[scaling] = [s, eps, tokens] { return run_scaling(*s, *eps, *tokens); };
}

}  // namespace expar::cli
