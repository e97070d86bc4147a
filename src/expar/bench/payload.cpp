#include "expar/bench/payload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"
#include "expar/moe/paths/path.hpp"
#include "expar/moe/payload_codec.hpp"

namespace expar::bench {

PayloadReport measure_payload(const PayloadBenchOptions& o) {
  std::vector<std::string> formats = o.formats;
  std::erase(formats, "f32");
  formats.insert(formats.begin(), "f32");  // the reference of every ratio
  PayloadReport report;
  report.options = o;
  report.options.formats = formats;
  std::vector<std::vector<PayloadRow>> by_format;
  for (const std::string& name : formats) {
    const PayloadFormat format = payload_format_from_name(name);  // throws naming the known formats
    PathsBenchOptions p;
    static_cast<LayerBenchSetup&>(p) = o;
    p.sync_comm = true;
    p.precision = PayloadPrecision::uniform(format);
    p.paths.clear();
    for (const std::string& path : benchmarked_paths(PayloadPrecision::uniform(PayloadFormat::BF16)))
      if (!path_traits(path).single_rank) p.paths.push_back(path);
    const PathsReport paths = measure_paths(p);
    std::vector<PayloadRow> rows;
    for (const PathResult& r : paths.results)
      rows.push_back({r.path, name, payload_row_bytes(format, o.model_dim), r});
    by_format.push_back(std::move(rows));
  }
  for (size_t path = 0; path < by_format.front().size(); ++path)
    for (const auto& rows : by_format) report.rows.push_back(rows[path]);
  return report;
}

namespace {

const PayloadRow& f32_of(const PayloadReport& report, const PayloadRow& row) {
  for (const PayloadRow& r : report.rows)
    if (r.path == row.path && r.format == "f32") return r;
  fail("bench payload: no f32 run of path {}", row.path);
}

}  // namespace

std::string format_payload_table(const PayloadReport& report) {
  const PayloadBenchOptions& o = report.options;
  std::string s = fmt::format(
      "expar bench payload: the MoE layer's paths that encode rows at each payload precision (all four "
      "legs); "
      "{} ranks x {} thread(s); T={} tokens/rank, d={}, h={}, E={}, top-{}; median of {} repeats after {} "
      "warm-up, max over ranks\n",
      o.ranks, o.threads, o.tokens, o.model_dim, o.hidden_dim, o.experts, o.top_k, o.repeats, o.warmup);
  s += fmt::format("{:<8} {:<12} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n", "path", "format",
                   "B/row", "MiB disp", "MiB comb", "MiB c.bwd", "MiB d.bwd", "fwd ms", "bwd ms", "fwd/f32",
                   "bwd/f32");
  auto mib = [](double b) { return fmt::format("{:.2f}", b / (1 << 20)); };
  for (const PayloadRow& row : report.rows) {
    const PathResult& r = row.result;
    const PathResult& f = f32_of(report, row).result;
    const double fwd = r.forward.dispatch_combine(), bwd = r.backward.dispatch_combine();
    s += fmt::format("{:<8} {:<12} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9.2f} {:>9.2f} {:>7.2f} {:>7.2f}\n",
                     row.path, row.format, row.row_bytes, mib(r.payload_bytes[0]), mib(r.payload_bytes[1]),
                     mib(r.payload_bytes[2]), mib(r.payload_bytes[3]), fwd * 1e3, bwd * 1e3,
                     fwd / std::max(1e-12, f.forward.dispatch_combine()),
                     bwd / std::max(1e-12, f.backward.dispatch_combine()));
  }
  s +=
      "  MiB: payload bytes this rank's routes move per leg (dispatch, combine, combine backward, dispatch "
      "backward; max over ranks);\n"
      "  fwd/bwd ms: every phase of the pass but the router, the route map and the grouped GEMM (encode, "
      "transfer, decode, merge),\n"
      "  each communication phase started with its peers (--sync-comm; the waits are not counted). The phase "
      "by phase figures:\n"
      "  expar bench paths --dispatch-precision F --combine-precision F ... with the same shape.\n";
  return s;
}

std::string payload_json(const PayloadReport& report) {
  using nlohmann::json;
  const PayloadBenchOptions& o = report.options;
  json j;
  j["options"] = setup_json(o);
  j["options"]["formats"] = o.formats;
  json rows = json::array();
  for (const PayloadRow& row : report.rows) {
    const PathResult& r = row.result;
    const PathResult& f = f32_of(report, row).result;
    rows.push_back(
        {{"path", row.path},
         {"format", row.format},
         {"row_bytes", row.row_bytes},
         {"leg_bytes",
          {{"dispatch", r.payload_bytes[0]},
           {"combine", r.payload_bytes[1]},
           {"combine_backward", r.payload_bytes[2]},
           {"dispatch_backward", r.payload_bytes[3]}}},
         {"forward_seconds", r.forward.dispatch_combine()},
         {"backward_seconds", r.backward.dispatch_combine()},
         {"forward_vs_f32", r.forward.dispatch_combine() / std::max(1e-12, f.forward.dispatch_combine())},
         {"backward_vs_f32",
          r.backward.dispatch_combine() / std::max(1e-12, f.backward.dispatch_combine())}});
  }
  j["rows"] = rows;
  return j.dump(2) + "\n";
}

}  // namespace expar::bench
