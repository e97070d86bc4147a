// expar bench generate: prefill and decode tokens/s of the inference engine beside the matmul and
// read-bandwidth limits measured in the same run (bench/generate.hpp).
#include <cstdio>

#include "expar/bench/generate.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/layout_options.hpp"
#include "expar/cli/option_checks.hpp"

namespace expar::cli {
namespace {

struct BenchGenerateArgs {
  bench::GenerateBenchOptions bench;
  std::string format = "auto";
  LayoutArgs layout;
  JsonOutput json;
};

void print_generate_table(const BenchGenerateArgs& a, const bench::GenerateBenchReport& r) {
  std::printf(
      "expar bench generate: %s, TP %d x DP %d, EP %s, decode %s, %d thread(s) per rank, %lld prompt + %d "
      "generated tokens, median of %d\n",
      a.bench.path.c_str(), a.layout.tp, a.layout.dp, ep_label(a.layout).c_str(), a.layout.decode_moe.c_str(),
      r.threads, static_cast<long long>(a.bench.prompt_tokens), a.bench.tokens, a.bench.repeats);
  std::printf("%-8s %12s %12s %9s  %s\n", "phase", "tokens/s", "limit", "fraction", "limit measured as");
  std::printf("%-8s %12.1f %12.1f %9.3f  sgemm at this rank's shapes: %.2f GFLOP in %.3f s (%.1f GFLOP/s)\n",
              "prefill", r.prefill_tokens_per_s,
              static_cast<double>(a.bench.prompt_tokens) / r.prefill_limit_seconds, r.prefill_matmul_fraction,
              r.prefill_flops * 1e-9, r.prefill_limit_seconds, r.matmul_flops * 1e-9);
  std::printf("%-8s %12.2f %12.2f %9.3f  read %.2f GB/s per rank / %.1f MB per token on the busiest rank\n",
              "decode", r.decode_tokens_per_s, r.read_bandwidth / r.decode_bytes_per_token,
              r.decode_bandwidth_fraction, r.read_bandwidth * 1e-9, r.decode_bytes_per_token * 1e-6);
  for (size_t rank = 0; rank < r.memory.size(); ++rank)
    std::printf("rank %zu memory (current, peak):\n%s", rank, format_memory(r.memory[rank]).c_str());
  std::printf("weights held (all ranks) %s, peak resident set of the process %s\n",
              format_bytes(r.weight_bytes).c_str(), format_bytes(r.peak_rss_bytes).c_str());
}

int run_bench_generate(BenchGenerateArgs& a) {
  a.bench.engine = engine_options(a.layout);
  if (a.format != "auto") a.bench.engine.format = infer::model_format_from_name(a.format);
  const bench::GenerateBenchReport r = bench::run_generate_bench(a.bench);
  if (a.json.table_wanted()) print_generate_table(a, r);
  a.json.write(bench::generate_bench_json(a.bench, r));
  return 0;
}

}  // namespace

void add_bench_generate(CLI::App* bench, CommandTable& table) {
  auto* cmd = bench->add_subcommand(
      "generate", "Prefill and decode tokens/s beside the matmul and read-bandwidth limits of the same run");
  auto a = std::make_shared<BenchGenerateArgs>();
  cmd->add_option("--path", a->bench.path, "Checkpoint directory or a file in one")->required();
  cmd->add_option("--format", a->format,
                  "Checkpoint format: auto | ours | mixtral | qwen-moe | qwen3-moe | olmoe | gpt-oss")
      ->capture_default_str()
      ->check(one_of({"auto", "ours", "mixtral", "qwen-moe", "qwen3-moe", "olmoe", "gpt-oss"}));
  cmd->add_option("--prompt-tokens", a->bench.prompt_tokens, "Prompt length (random tokens)")
      ->capture_default_str()
      ->check(integer_in(1, 1 << 20));
  cmd->add_option("--tokens", a->bench.tokens, "Tokens generated (the first from the prefill)")
      ->capture_default_str()
      ->check(integer_in(2, 1 << 20));
  cmd->add_option("--repeats", a->bench.repeats, "Timed repeats (the median is reported)")
      ->capture_default_str()
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", a->bench.warmup, "Untimed repeats first")
      ->capture_default_str()
      ->check(integer_in(0, 1000));
  add_layout_options(cmd, a->layout, true);
  add_json_option(cmd, a->json, "the results");
  table[cmd] = [a] { return run_bench_generate(*a); };
}

}  // namespace expar::cli
