// `expar bench paths`: the phase-by-phase table of every execution path (seed 000 Table 7, Figure 17) with
// each phase as a fraction of the machine's limit measured in the same run, and the per-rank memory of one
// MoE layer training step with and without EP (Table 6). --json and --svg write the same figures.
#include "expar/cli/bench_paths.hpp"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "expar/cli/commands.hpp"
#include "expar/cli/option_checks.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar::cli {

namespace {

std::string ms(double seconds) {
  return fmt::format("{:.3f}", seconds * 1e3);
}

std::string cell(const PathsReport& report, const PathResult& r, const std::string& phase, bool forward) {
  const PassTimes& pass = forward ? r.forward : r.backward;
  bool present = false;
  for (const auto& p : pass.phases) present = present || p.first == phase;
  if (!present) return "-";
  const double f = limit_fraction(report, r, phase, forward);
  const std::string t = ms(pass.phase_seconds(phase));
  return f > 0.0 ? fmt::format("{} ({:.0f}%)", t, 100.0 * f) : t;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  EXPAR_CHECK(out.good(), "cannot write '{}': check the directory exists and is writable", path);
  out << text;
}

}  // namespace

std::string format_paths_table(const PathsReport& report) {
  const auto& o = report.options;
  const auto& l = report.limits;
  std::string s;
  s += fmt::format(
      "expar bench paths: {} ranks (EP {}) x {} compute thread(s); T={} tokens/rank, d={}, h={}, E={}, "
      "top-{}; "
      "median of {} repeats after {} warm-up, max over ranks{}\n",
      o.ranks, o.ep, o.threads, o.tokens, o.model_dim, o.hidden_dim, o.experts, o.top_k, o.repeats, o.warmup,
      o.sync_comm ? "; --sync-comm: a barrier before each communication phase, booked as 'wait for peers'"
                  : "");
  s += fmt::format(
      "limits (same run, every rank at once): oneDNN matmul [{} x {}]·[{} x {}] {:.1f} GFLOP/s per rank; "
      "memcpy {} {:.2f} GB/s per rank (bytes read + written)\n",
      l.matmul_rows, o.model_dim, o.model_dim, o.hidden_dim, l.matmul_flops / 1e9,
      format_bytes(l.memcpy_bytes), l.memcpy_bandwidth / 1e9);
  s += "ms per phase (% of limit: grouped GEMM vs matmul FLOP/s, data movement vs memcpy bandwidth)\n";
  for (bool forward : {true, false}) {
    s += fmt::format("\n{:<32}", forward ? "FORWARD" : "BACKWARD (adjoint of)");
    for (const auto& r : report.results) s += fmt::format("{:>18}", r.path);
    s += "\n";
    std::vector<std::string> names;
    for (const auto& r : report.results)
      for (const auto& p : (forward ? r.forward : r.backward).phases)
        if (std::find(names.begin(), names.end(), p.first) == names.end()) names.push_back(p.first);
    // Keep the measurement's display order (dispatch, GEMM, combine) across paths.
    std::vector<std::string> ordered;
    for (const char* n :
         {phase::kWait, phase::kRouter, phase::kRouteMap, phase::kLocalPermute, phase::kAllToAllDispatch,
          phase::kGlobalPermute, phase::kRowDispatch, phase::kAllGather, phase::kRowCopy, phase::kGroupedGemm,
          phase::kGlobalUnpermute, phase::kAllToAllCombine, phase::kLocalUnpermuteMerge,
          phase::kRowGatherReduce, phase::kPartialMerge, phase::kReduceScatter})
      if (std::find(names.begin(), names.end(), n) != names.end()) ordered.push_back(n);
    for (const auto& n : ordered) {
      s += fmt::format("  {:<30}", n);
      for (const auto& r : report.results) s += fmt::format("{:>18}", cell(report, r, n, forward));
      s += "\n";
    }
    s += fmt::format("  {:<30}", "dispatch + combine");
    for (const auto& r : report.results)
      s += fmt::format("{:>18}", ms((forward ? r.forward : r.backward).dispatch_combine()));
    s += fmt::format("\n  {:<30}", "pass (wall, max over ranks)");
    for (const auto& r : report.results)
      s += fmt::format("{:>18}", ms((forward ? r.forward : r.backward).total));
    s += "\n";
  }
  s += fmt::format("\n{:<32}", "STEP (forward + backward)");
  for (const auto& r : report.results) s += fmt::format("{:>18}", ms(r.step()));
  s += fmt::format("\n{:<32}", "dispatch + combine, fwd + bwd");
  for (const auto& r : report.results)
    s += fmt::format("{:>18}", ms(r.forward.dispatch_combine() + r.backward.dispatch_combine()));
  s += "\n";
  return s;
}

std::string format_memory_table(const std::vector<MemoryRow>& rows) {
  std::string s =
      "\nMEMORY: peak bytes per rank of one MoE layer training step (forward + backward), max over ranks\n";
  s += fmt::format("  {:<30}", "category");
  for (const auto& r : rows) s += fmt::format("{:>28}", r.label);
  s += "\n";
  for (size_t c = 0; c < kNumMemCategories; ++c) {
    bool any = false;
    for (const auto& r : rows) any = any || r.peak.peak[c] > 0;
    if (!any) continue;
    s += fmt::format("  {:<30}", mem_category_name(static_cast<MemCategory>(c)));
    for (const auto& r : rows) s += fmt::format("{:>28}", format_bytes(r.peak.peak[c]));
    s += "\n";
  }
  s += fmt::format("  {:<30}", "total peak (high-water mark)");
  for (const auto& r : rows) s += fmt::format("{:>28}", format_bytes(r.peak.total_peak));
  s += "\n  (per-category peaks are reached at different moments; the total is the high-water mark of the "
       "sum)\n";
  return s;
}

std::string paths_json(const PathsReport& report, const std::vector<MemoryRow>& memory) {
  using nlohmann::json;
  const auto& o = report.options;
  json j;
  j["options"] = {{"ranks", o.ranks},   {"ep", o.ep},           {"tokens_per_rank", o.tokens},
                  {"d", o.model_dim},   {"h", o.hidden_dim},    {"experts", o.experts},
                  {"top_k", o.top_k},   {"threads", o.threads}, {"repeats", o.repeats},
                  {"warmup", o.warmup}, {"seed", o.seed}};
  j["limits"] = {{"matmul_flops_per_s", report.limits.matmul_flops},
                 {"matmul_rows", report.limits.matmul_rows},
                 {"memcpy_bytes_per_s", report.limits.memcpy_bandwidth},
                 {"memcpy_bytes", report.limits.memcpy_bytes}};
  json paths = json::array();
  for (const auto& r : report.results) {
    json p;
    p["path"] = r.path;
    for (bool forward : {true, false}) {
      const PassTimes& pass = forward ? r.forward : r.backward;
      json phases = json::array();
      for (const auto& [name, seconds] : pass.phases) {
        json ph = {{"phase", name},
                   {"seconds", seconds},
                   {"limit_fraction", limit_fraction(report, r, name, forward)}};
        if (auto it = r.bytes_of(forward).find(name); it != r.bytes_of(forward).end())
          ph["bytes"] = it->second;
        phases.push_back(ph);
      }
      p[forward ? "forward" : "backward"] = {{"phases", phases},
                                             {"dispatch_combine_seconds", pass.dispatch_combine()},
                                             {"total_seconds", pass.total}};
    }
    p["gemm_flops"] = {{"forward", r.gemm_flops_forward}, {"backward", r.gemm_flops_backward}};
    p["step_seconds"] = r.step();
    paths.push_back(p);
  }
  j["paths"] = paths;
  json mem = json::array();
  for (const auto& row : memory) {
    json m = {{"label", row.label}, {"ranks", row.ranks}, {"total_peak_bytes", row.peak.total_peak}};
    for (size_t c = 0; c < kNumMemCategories; ++c)
      if (row.peak.peak[c] > 0)
        m["peak_bytes"][std::string(mem_category_name(static_cast<MemCategory>(c)))] = row.peak.peak[c];
    mem.push_back(m);
  }
  j["memory"] = mem;
  return j.dump(2) + "\n";
}

std::string paths_svg(const PathsReport& report) {
  // Figure 17's style: one lane per path and pass, phases as cumulative bars on one duration axis.
  const double width = 900, left = 170, lane_h = 34, gap = 14, top = 60;
  double longest = 1e-12;
  for (const auto& r : report.results)
    longest = std::max({longest, r.forward.total, r.backward.total,
                        r.forward.dispatch_combine() + r.forward.phase_seconds(phase::kGroupedGemm) +
                            r.forward.phase_seconds(phase::kRouter),
                        r.backward.dispatch_combine() + r.backward.phase_seconds(phase::kGroupedGemm) +
                            r.backward.phase_seconds(phase::kRouter)});
  const double scale = (width - left - 20) / longest;
  auto color = [](PhaseKind k) {
    switch (k) {
      case PhaseKind::Router:
        return "#c7c7c7";
      case PhaseKind::RouteMap:
        return "#76b7b2";
      case PhaseKind::Layout:
        return "#4e79a7";
      case PhaseKind::Collective:
        return "#f28e2b";
      case PhaseKind::Rowwise:
        return "#59a14f";
      case PhaseKind::Compute:
        return "#9c755f";
      case PhaseKind::Wait:
        return "#e15759";
    }
    return "#000000";
  };
  const size_t lanes = report.results.size() * 2;
  const double height = top + static_cast<double>(lanes) * (lane_h + gap) + 90;
  const auto& o = report.options;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  s += fmt::format(
      "<text x=\"10\" y=\"20\" font-size=\"14\">expar bench paths: cumulative phase durations (median of max "
      "over "
      "ranks)</text>\n<text x=\"10\" y=\"38\">{} ranks (EP {}) x {} thread(s), T={}/rank, d={}, h={}, E={}, "
      "top-{}</text>\n",
      o.ranks, o.ep, o.threads, o.tokens, o.model_dim, o.hidden_dim, o.experts, o.top_k);
  double y = top;
  for (bool forward : {true, false})
    for (const auto& r : report.results) {
      const PassTimes& pass = forward ? r.forward : r.backward;
      double sum = 0.0;
      for (const auto& p : pass.phases) sum += p.second;
      s += fmt::format("<text x=\"10\" y=\"{:.0f}\">{} {}</text>\n", y + lane_h / 2 + 4, r.path,
                       forward ? "forward" : "backward");
      double x = left;
      for (const auto& [name, seconds] : pass.phases) {
        const double w = seconds * scale;
        s += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{:.0f}\" width=\"{:.1f}\" height=\"{:.0f}\" fill=\"{}\" "
            "stroke=\"white\"><title>{}: "
            "{} ms</title></rect>\n",
            x, y, std::max(w, 0.5), lane_h, color(phase_kind(name)), name, ms(seconds));
        if (w > 70)
          s += fmt::format(
              "<text x=\"{:.1f}\" y=\"{:.0f}\" fill=\"white\">{}</text>\n<text x=\"{:.1f}\" y=\"{:.0f}\" "
              "fill=\"white\">{} ms</text>\n",
              x + 3, y + 14, name, x + 3, y + 27, ms(seconds));
        x += w;
      }
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\">{} ms</text>\n", x + 4, y + lane_h / 2 + 4, ms(sum));
      y += lane_h + gap;
    }
  double lx = 10;
  for (auto [kind, label] :
       {std::pair{PhaseKind::Router, "router"}, std::pair{PhaseKind::RouteMap, "route map"},
        std::pair{PhaseKind::Layout, "layout transform"}, std::pair{PhaseKind::Collective, "collective"},
        std::pair{PhaseKind::Rowwise, "rowwise phase"}, std::pair{PhaseKind::Compute, "expert computation"},
        std::pair{PhaseKind::Wait, "wait for peers"}}) {
    s += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.0f}\" "
        "y=\"{:.0f}\">{}</text>\n",
        lx, y + 10, color(kind), lx + 16, y + 20, label);
    lx += 125;
  }
  s += fmt::format(
      "<text x=\"10\" y=\"{:.0f}\">Widths are cumulative phase durations on one axis, not a timeline; "
      "hover a bar for its phase and duration.</text>\n</svg>\n",
      y + 45);
  return s;
}

void add_bench_paths(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "paths",
      "Every execution path on identical inputs and routes: phase table (Table 7), limits, memory (Table 6)");
  auto o = std::make_shared<PathsBenchOptions>();
  auto json_path = std::make_shared<std::string>();
  auto svg_path = std::make_shared<std::string>();
  auto no_memory = std::make_shared<bool>(false);
  cmd->add_option("--ranks", o->ranks, "ranks (threads of this process)")->check(integer_in(1, 256));
  cmd->add_option("--ep", o->ep, "EP degree (default: --ranks)")->check(integer_in(0, 256));
  cmd->add_option("--tokens", o->tokens, "tokens per rank")->check(integer_in(1, 1 << 20));
  cmd->add_option("--d", o->model_dim, "model dimension")->check(integer_in(1, 1 << 16));
  cmd->add_option("--h", o->hidden_dim, "expert hidden dimension")->check(integer_in(1, 1 << 16));
  cmd->add_option("--experts", o->experts, "routed experts E")->check(integer_in(1, 4096));
  cmd->add_option("--top-k", o->top_k, "routes per token K")->check(integer_in(1, 4096));
  cmd->add_option("--threads", o->threads, "compute (oneDNN) threads per rank")->check(integer_in(1, 256));
  cmd->add_option("--repeats", o->repeats, "measured repeats (the median is shown)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", o->warmup, "warm-up steps before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--paths", o->paths, "paths to run (local, block, rowwise, agrs)")->delimiter(',');
  cmd->add_option("--seed", o->seed, "seed of inputs and weights");
  cmd->add_flag("--oversubscribe", o->oversubscribe, "allow ranks x threads above the cores");
  cmd->add_flag("--no-memory", *no_memory, "skip the memory table");
  cmd->add_flag("--sync-comm", o->sync_comm,
                "barrier before each communication phase, shown as 'wait for peers' (phases then measure "
                "moving rows, not the slowest peer)");
  cmd->add_option("--json", *json_path, "also write the figures as JSON to this file");
  cmd->add_option("--svg", *svg_path, "also write a Figure 17-style chart to this file");
  table[cmd] = [o, json_path, svg_path, no_memory] {
    const PathsReport report = measure_paths(*o);
    fmt::print("{}", format_paths_table(report));
    std::vector<MemoryRow> memory;
    if (!*no_memory) {
      memory = measure_memory(*o);
      fmt::print("{}", format_memory_table(memory));
    }
    if (!json_path->empty()) write_file(*json_path, paths_json(report, memory));
    if (!svg_path->empty()) write_file(*svg_path, paths_svg(report));
    return 0;
  };
}

}  // namespace expar::cli
