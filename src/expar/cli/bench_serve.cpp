// expar bench serve: requests/s, output tokens/s and p50/p99 time to first token and per output token at
// several concurrencies, each beside the single-request decode rate of the same run (bench/serve.hpp).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "expar/bench/serve.hpp"
#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"
#include "expar/topo/placement.hpp"

namespace expar::cli {
namespace {

struct BenchServeArgs {
  bench::ServeBenchOptions bench;
  std::string path, format = "auto", placement = "contiguous", json;
  int tp = 1, dp = 1, ep = 0, threads = 0;
  bool no_ep = false, no_batch_invariant = false, oversubscribe = false;
};

int run_bench_serve(BenchServeArgs& a) {
  EXPAR_CHECK(!a.path.empty(), "expar bench serve needs a model: pass --path <checkpoint>");
  EXPAR_CHECK(a.tp >= 1 && a.dp >= 1 && a.tp * a.dp <= 1024, "--tp {} x --dp {} must be in [1, 1024]", a.tp,
              a.dp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ranks = a.tp * a.dp;
  const int threads = a.threads > 0 ? a.threads : std::max(1, cores / ranks);
  EXPAR_CHECK(a.oversubscribe || ranks * threads <= cores,
              "{} ranks x {} threads exceed the {} cores: lower --threads/--tp/--dp or pass --oversubscribe",
              ranks, threads, cores);
  serve::RuntimeOptions& r = a.bench.runtime;
  r.path = a.path;
  r.model.tp = a.tp;
  r.model.dp = a.dp;
  r.model.enable_expert_parallel = !a.no_ep;
  if (a.ep > 0) r.model.ep_degree = a.ep;
  r.model.placement = placement_from_name(a.placement);
  if (a.format != "auto") r.model.format = infer::model_format_from_name(a.format);
  r.model.compute_threads = threads;
  r.batch_invariant = !a.no_batch_invariant;
  const bench::ServeBenchResult res = bench::run_serve_bench(a.bench);
  std::printf(
      "expar bench serve: %s, TP %d x DP %d, %d thread(s) per rank, %lld prompt + %lld generated tokens "
      "per request, batch-invariant %s\n",
      a.path.c_str(), a.tp, a.dp, threads, static_cast<long long>(a.bench.prompt_tokens),
      static_cast<long long>(a.bench.generated_tokens), r.batch_invariant ? "on" : "off");
  std::printf("single request alone: %.1f decode tokens/s (the reference)\n",
              res.single_request_decode_tokens_per_s);
  std::printf("%11s %9s %8s %10s %11s %10s %10s %10s %10s %9s\n", "concurrency", "requests", "req/s",
              "out tok/s", "x single", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "seconds");
  nlohmann::json levels = nlohmann::json::array();
  for (const bench::ServeLevel& l : res.levels) {
    std::printf("%11d %9lld %8.2f %10.1f %10.2fx %8.1fms %8.1fms %8.2fms %8.2fms %9.2f\n", l.concurrency,
                static_cast<long long>(l.requests), l.requests_per_s, l.output_tokens_per_s, l.speedup,
                l.ttft_p50 * 1e3, l.ttft_p99 * 1e3, l.tpot_p50 * 1e3, l.tpot_p99 * 1e3, l.seconds);
    levels.push_back({{"concurrency", l.concurrency},
                      {"requests", l.requests},
                      {"requests_per_s", l.requests_per_s},
                      {"output_tokens_per_s", l.output_tokens_per_s},
                      {"speedup_over_single_request", l.speedup},
                      {"ttft_p50_s", l.ttft_p50},
                      {"ttft_p99_s", l.ttft_p99},
                      {"tpot_p50_s", l.tpot_p50},
                      {"tpot_p99_s", l.tpot_p99}});
  }
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    EXPAR_CHECK(out.good(), "--json '{}' cannot be written: pass a writable path", a.json);
    out << nlohmann::json({{"single_request_decode_tokens_per_s", res.single_request_decode_tokens_per_s},
                           {"levels", levels}})
               .dump(2)
        << "\n";
    EXPAR_CHECK(out.good(), "writing --json '{}' failed (disk full?)", a.json);
  }
  return 0;
}

}  // namespace

void add_bench_serve(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "serve", "Serving throughput and latency at several concurrencies vs one request alone");
  auto a = std::make_shared<BenchServeArgs>();
  cmd->add_option("--path", a->path, "Checkpoint directory or a file in one")->required();
  cmd->add_option("--format", a->format, "Checkpoint format (auto: detected)")->capture_default_str();
  cmd->add_option("--tp", a->tp, "Tensor-parallel degree")->capture_default_str();
  cmd->add_option("--dp", a->dp, "Data-parallel replicas")->capture_default_str();
  cmd->add_option("--ep", a->ep, "EP degree (0: TP*DP)")->capture_default_str();
  cmd->add_flag("--no-ep", a->no_ep, "Experts sharded over TP instead of EP");
  cmd->add_option("--placement", a->placement, "contiguous | round-robin")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads per rank (0: cores / ranks)")
      ->capture_default_str();
  cmd->add_flag("--oversubscribe", a->oversubscribe, "Allow ranks x threads above the cores");
  cmd->add_flag("--no-batch-invariant", a->no_batch_invariant, "Faster kernels for small batches");
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
  cmd->add_option("--kv-cache-mb", a->bench.runtime.kv_cache_mb, "KV cache per rank (MiB)")
      ->capture_default_str();
  cmd->add_option("--max-running", a->bench.runtime.scheduler.max_running, "Sequences per replica in a step")
      ->capture_default_str();
  cmd->add_option("--json", a->json, "Also write the results to this JSON file");
  table[cmd] = [a] { return run_bench_serve(*a); };
}

}  // namespace expar::cli
