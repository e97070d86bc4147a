// The report side of `expar bench paths` (bench/paths.hpp): the phase table (seed 000 Table 7) with each
// phase as a fraction of the machine's limit measured in the same run, the per-leg payload bytes, the
// per-rank memory of one MoE layer training step with and without EP (Table 6), JSON and a Figure 17-style
// SVG.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "expar/bench/paths.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar::bench {

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

// Ranks per node of the world the paths ran on, in node order.
std::vector<int> node_sizes(const NodeMap& nodes) {
  std::vector<int> sizes(static_cast<size_t>(nodes.num_nodes), 0);
  for (int n : nodes.node_of) ++sizes[static_cast<size_t>(n)];
  return sizes;
}

bool uniform(const std::vector<int>& sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [&](int n) { return n == sizes[0]; });
}

}  // namespace

std::string format_paths_table(const PathsReport& report) {
  const auto& o = report.options;
  const auto& l = report.limits;
  std::string s;
  s += fmt::format(
      "expar bench paths: {} ranks{} (EP {}) x {} compute thread(s); T={} tokens/rank, d={}, h={}, E={}, "
      "top-{}; payload {}; products {}; "
      "median of {} repeats after {} warm-up, max over ranks{}\n",
      o.ranks, o.transport == "mpi" ? " as MPI processes" : "", o.ep, o.threads, o.tokens, o.model_dim,
      o.hidden_dim, o.experts, o.top_k, o.precision.describe(),
      o.bf16_products ? "bf16 (f32 accumulation)" : "f32", o.repeats, o.warmup,
      o.sync_comm ? "; --sync-comm: a barrier before each communication phase, booked as 'wait for peers'"
                  : "");
  if (o.router_skew > 0 || o.redundant_experts > 0)
    s += fmt::format(
        "routing: router skew {:g} (expert popularity ~ 1/rank^{:g}); {} redundant expert slot(s){}\n",
        o.router_skew, o.router_skew, o.redundant_experts,
        o.redundant_experts > 0 ? " placed by EPLB from the routes of another batch (single-rank paths: none)"
                                : "");
  s += fmt::format(
      "limits (same run, every rank at once): oneDNN {}matmul [{} x {}]·[{} x {}] {:.1f} GFLOP/s per rank; "
      "memcpy {} {:.2f} GB/s per rank (bytes read + written)\n",
      o.bf16_products ? "BF16 " : "", l.matmul_rows, o.model_dim, o.model_dim, o.hidden_dim,
      l.matmul_flops / 1e9, format_bytes(l.memcpy_bytes), l.memcpy_bandwidth / 1e9);
  s += "grouped GEMM limit: the same matmul at each path's expert rows as one product, every rank at once as "
       "the phase runs, timed between that path's repeats:";
  for (const auto& r : report.results)
    s += fmt::format(" {} [{} rows] {:.1f}", r.path, r.matmul_rows, gemm_limit(report, r) / 1e9);
  s += " GFLOP/s\n";
  s += "ms per phase (% of limit: grouped GEMM vs matmul FLOP/s, data movement vs memcpy bandwidth)\n";
  if (!o.precision.all_f32())
    s += "  reduced-precision legs: data-movement bytes count each row at its leg's encoded size (the f32 "
         "side "
         "of encode and decode is not counted: the % is a lower bound); the grouped GEMM phase includes "
         "decoding the dispatch payload (forward, and again for Wgrad)\n";
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
  s += fmt::format("\n{:<32}", "rank load (max-mean)/mean");
  for (const auto& r : report.results) s += fmt::format("{:>18.3f}", r.rank_load_imbalance);
  s += "\n";
  // What each leg carries: accepted routes sent by the slowest rank, times its leg's encoded row.
  s += fmt::format("\nPAYLOAD per rank and step (max over ranks): {}\n  {:<30}", o.precision.describe(),
                   "routes moved (rows)");
  for (const auto& r : report.results) s += fmt::format("{:>18}", r.routes_moved);
  const char* legs[4] = {"dispatch fwd", "combine fwd", "combine bwd", "dispatch bwd"};
  const PayloadFormat formats[4] = {o.precision.dispatch, o.precision.combine, o.precision.combine_grad,
                                    o.precision.dispatch_grad};
  for (int l = 0; l < 4; ++l) {
    const std::string label = fmt::format("{} ({})", legs[l], payload_format_name(formats[l]));
    s += fmt::format("\n  {:<30}", label);
    for (const auto& r : report.results)
      s += fmt::format("{:>18}", format_bytes(static_cast<int64_t>(r.payload_bytes[l])));
  }
  s += "\n";
  s += format_traffic(report);
  return s;
}

std::string format_traffic(const PathsReport& report) {
  const std::vector<int> sizes = node_sizes(report.nodes);
  std::string s = fmt::format(
      "\nMESSAGES per step (forward + backward), all ranks, {} node(s) of {} rank(s){}: collectives count "
      "one message per peer with data, one-sided one per put/get\n",
      report.nodes.num_nodes,
      uniform(sizes) ? std::to_string(sizes[0]) : fmt::format("{}", fmt::join(sizes, ",")),
      report.options.transport == "mpi" ? " (MPI_COMM_TYPE_SHARED)" : "");
  s += fmt::format("  {:<30}", "path");
  for (const auto& r : report.results) s += fmt::format("{:>18}", r.path);
  s += "\n";
  struct Row {
    const char* label;
    bool one_sided, across, bytes;
  };
  for (const Row& row : {Row{"collective msgs across nodes", false, true, false},
                         Row{"collective bytes across nodes", false, true, true},
                         Row{"one-sided msgs across nodes", true, true, false},
                         Row{"one-sided bytes across nodes", true, true, true},
                         Row{"collective msgs within nodes", false, false, false},
                         Row{"collective bytes within nodes", false, false, true},
                         Row{"one-sided msgs within nodes", true, false, false},
                         Row{"one-sided bytes within nodes", true, false, true}}) {
    s += fmt::format("  {:<30}", row.label);
    for (const auto& r : report.results) {
      const TrafficStats& t = row.one_sided ? r.one_sided_traffic : r.collective_traffic;
      const int64_t v = row.across ? (row.bytes ? t.inter_node_bytes : t.inter_node_messages)
                                   : (row.bytes ? t.intra_node_bytes : t.intra_node_messages);
      s += row.bytes ? fmt::format("{:>18}", format_bytes(v)) : fmt::format("{:>18}", v);
    }
    s += "\n";
  }
  s += "  (one-sided within nodes: puts/gets only; copies through a mapped peer pointer are not messages)\n";
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
  j["options"] = setup_json(o);
  j["options"]["transport"] = o.transport;
  // The nodes the ranks ran on (emulated or MPI's): ranks_per_node when every node holds as many ranks.
  const std::vector<int> sizes = node_sizes(report.nodes);
  j["options"]["nodes"] = report.nodes.num_nodes;
  j["options"]["node_ranks"] = sizes;
  j["options"]["ranks_per_node"] = uniform(sizes) ? json(sizes[0]) : json(nullptr);
  j["options"]["ep"] = o.ep;
  j["options"]["precision"] = {{"dispatch", payload_format_name(o.precision.dispatch)},
                               {"combine", payload_format_name(o.precision.combine)},
                               {"combine_grad", payload_format_name(o.precision.combine_grad)},
                               {"dispatch_grad", payload_format_name(o.precision.dispatch_grad)}};
  j["options"]["products"] = o.bf16_products ? "bf16" : "f32";
  j["options"]["router_skew"] = o.router_skew;
  j["options"]["redundant_experts"] = o.redundant_experts;
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
    p["rank_load_imbalance"] = r.rank_load_imbalance;
    p["gemm_limit"] = {{"matmul_flops_per_s", gemm_limit(report, r)}, {"matmul_rows", r.matmul_rows}};
    p["step_seconds"] = r.step();
    auto traffic_json = [](const TrafficStats& t) {
      return nlohmann::json{{"intra_node_messages", t.intra_node_messages},
                            {"intra_node_bytes", t.intra_node_bytes},
                            {"inter_node_messages", t.inter_node_messages},
                            {"inter_node_bytes", t.inter_node_bytes}};
    };
    p["traffic_per_step"] = {{"collective", traffic_json(r.collective_traffic)},
                             {"one_sided", traffic_json(r.one_sided_traffic)}};
    p["payload"] = {{"routes_moved", r.routes_moved},
                    {"dispatch_bytes", r.payload_bytes[0]},
                    {"combine_bytes", r.payload_bytes[1]},
                    {"combine_grad_bytes", r.payload_bytes[2]},
                    {"dispatch_grad_bytes", r.payload_bytes[3]}};
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

}  // namespace expar::bench
