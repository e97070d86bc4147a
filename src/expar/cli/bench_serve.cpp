// expar bench serve: requests/s, output tokens/s and p50/p99 time to first token and per output token at
// several concurrencies, each beside the single-request decode rate of the same run (bench/serve.hpp).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "expar/bench/serve.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/serve_options.hpp"

namespace expar::cli {
namespace {

struct BenchServeArgs {
  bench::ServeBenchOptions bench;
  RuntimeArgs runtime;
  JsonOutput json;
};

void print_serve_table(const BenchServeArgs& a, const bench::ServeBenchResult& res) {
  const serve::RuntimeOptions& r = a.bench.runtime;
  fmt::print(
      "expar bench serve: {}, TP {} x DP {}, {} thread(s) per rank, {} prompt + {} generated tokens per "
      "request, batch-invariant {}\n",
      r.path, r.model.tp, r.model.dp, r.model.compute_threads, a.bench.prompt_tokens,
      a.bench.generated_tokens, r.batch_invariant ? "on" : "off");
  fmt::print("single request alone: {:.1f} decode tokens/s (the reference)\n",
             res.single_request_decode_tokens_per_s);
  fmt::print("{:>11} {:>9} {:>8} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "concurrency",
             "requests", "req/s", "out tok/s", "x single", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
             "seconds");
  // Widths are right-aligned explicitly: fmt left-aligns inf and nan in a bare width, printf did not.
  for (const bench::ServeLevel& l : res.levels)
    fmt::print(
        "{:>11} {:>9} {:>8.2f} {:>10.1f} {:>10.2f}x {:>8.1f}ms {:>8.1f}ms {:>8.2f}ms {:>8.2f}ms {:>9.2f}\n",
        l.concurrency, l.requests, l.requests_per_s, l.output_tokens_per_s, l.speedup, l.ttft_p50 * 1e3,
        l.ttft_p99 * 1e3, l.tpot_p50 * 1e3, l.tpot_p99 * 1e3, l.seconds);
}

std::string serve_bench_json(const bench::ServeBenchResult& res) {
  nlohmann::json levels = nlohmann::json::array();
  for (const bench::ServeLevel& l : res.levels)
    levels.push_back({{"concurrency", l.concurrency},
                      {"requests", l.requests},
                      {"requests_per_s", l.requests_per_s},
                      {"output_tokens_per_s", l.output_tokens_per_s},
                      {"speedup_over_single_request", l.speedup},
                      {"ttft_p50_s", l.ttft_p50},
                      {"ttft_p99_s", l.ttft_p99},
                      {"tpot_p50_s", l.tpot_p50},
                      {"tpot_p99_s", l.tpot_p99}});
  return nlohmann::json({{"single_request_decode_tokens_per_s", res.single_request_decode_tokens_per_s},
                         {"levels", levels}})
             .dump(2) +
         "\n";
}

int run_bench_serve(BenchServeArgs& a) {
  a.bench.runtime = runtime_options(a.runtime);
  const bench::ServeBenchResult res = bench::run_serve_bench(a.bench);
  if (a.json.table_wanted()) print_serve_table(a, res);
  a.json.write(serve_bench_json(res));
  return 0;
}

}  // namespace

void add_bench_serve(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "serve", "Serving throughput and latency at several concurrencies vs one request alone");
  auto a = std::make_shared<BenchServeArgs>();
  add_runtime_options(cmd, a->runtime);
  cmd->add_option("--concurrency", a->bench.concurrency, "Clients in flight, one level each")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--requests-per-client", a->bench.requests_per_client,
                  "Requests each client runs per level")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", a->bench.prompt_tokens, "Prompt length of every request")
      ->capture_default_str();
  cmd->add_option("--tokens", a->bench.generated_tokens, "Tokens generated per request")
      ->capture_default_str();
  add_json_option(cmd, a->json, "the results");
  table[cmd] = [a] { return run_bench_serve(*a); };
}

}  // namespace expar::cli
