// expar bench generate: prefill and decode tokens/s of the inference engine beside the matmul and
// read-bandwidth limits measured in the same run (bench/generate.hpp).
#include <fmt/format.h>

#include "expar/bench/generate.hpp"
#include "expar/cli/checkpoint_flags.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/json_output.hpp"
#include "expar/cli/layout_options.hpp"
#include "expar/cli/option_checks.hpp"

namespace expar::cli {
namespace {

struct BenchGenerateArgs {
  bench::GenerateBenchOptions bench;
  CheckpointArgs checkpoint;  // --checkpoint, --format
  LayoutArgs layout;
  JsonOutput json;
};

void print_generate_table(const BenchGenerateArgs& a, const bench::GenerateBenchReport& r) {
  fmt::print(
      "expar bench generate: {}, TP {} x DP {}, EP {}, decode {}, {} thread(s) per rank, products {}, {} "
      "prompt + {} generated tokens, median of {}\n",
      a.bench.path, a.layout.tp, a.layout.dp,
      ep_label(a.layout.enable_expert_parallel, r.ep_degree, a.layout.tp, a.layout.dp), a.layout.decode_moe,
      r.threads, a.layout.precision, a.bench.prompt_tokens, a.bench.tokens, a.bench.repeats);
  // Widths are right-aligned explicitly: fmt left-aligns inf and nan in a bare width, printf did not.
  fmt::print("{:<8} {:>12} {:>12} {:>9}  {}\n", "phase", "tokens/s", "limit", "fraction",
             "limit measured as");
  fmt::print(
      "{:<8} {:>12.1f} {:>12.1f} {:>9.3f}  {} at this rank's shapes: {:.2f} GFLOP in {:.3f} s ({:.1f} "
      "GFLOP/s)\n",
      "prefill", r.prefill_tokens_per_s, static_cast<double>(a.bench.prompt_tokens) / r.prefill_limit_seconds,
      r.prefill_matmul_fraction,
      a.layout.precision == "bf16" ? "sgemm, BF16 weights in oneDNN's BF16 matmul," : "sgemm",
      r.prefill_flops * 1e-9, r.prefill_limit_seconds, r.matmul_flops * 1e-9);
  fmt::print(
      "{:<8} {:>12.2f} {:>12.2f} {:>9.3f}  read {:.2f} GB/s per rank / {:.1f} MB per token on the busiest "
      "rank\n",
      "decode", r.decode_tokens_per_s, r.read_bandwidth / r.decode_bytes_per_token,
      r.decode_bandwidth_fraction, r.read_bandwidth * 1e-9, r.decode_bytes_per_token * 1e-6);
  fmt::print(
      "{:<8} {:>12} {:>12.2f} {:>9.3f}  the same with the experts the routes put on each layer's busiest "
      "rank: {:.1f} MB per token\n",
      "routed", "", r.read_bandwidth / r.decode_routed_bytes_per_token, r.decode_routed_fraction,
      r.decode_routed_bytes_per_token * 1e-6);
  fmt::print(
      "expert load per rank, (max - mean) / mean of the rows each rank's experts computed, mean over the MoE "
      "layers (largest): prefill {:.3f} ({:.3f}), decode {:.3f} ({:.3f}); router skew {:g}\n",
      r.prefill_imbalance, r.prefill_imbalance_max, r.decode_imbalance, r.decode_imbalance_max,
      a.bench.router_skew);
  if (a.layout.redundant_experts > 0)
    fmt::print(
        "{} redundant experts placed by EPLB per MoE layer from untimed runs on {} other prompt(s): {}\n",
        a.layout.redundant_experts, a.bench.eplb_prompts,
        r.rebalanced ? fmt::format("moved {} layer(s), {} of expert weights (all ranks) in {:.1f} ms",
                                   r.moved_layers, format_bytes(r.moved_bytes), r.move_seconds * 1e3)
                     : std::string("the initial placement was kept"));
  for (size_t rank = 0; rank < r.memory.size(); ++rank)
    fmt::print("rank {} memory (current, peak):\n{}", rank, format_memory(r.memory[rank]));
  fmt::print("weights held (all ranks) {}, peak resident set of the process {}\n",
             format_bytes(r.weight_bytes), format_bytes(r.peak_rss_bytes));
  fmt::print("KV cache per position on rank 0: {}{}\n", format_bytes(r.kv_bytes_per_token),
             r.kv_bytes_per_token_expanded > 0
                 ? fmt::format(" (the latent; expanded keys and values of its heads: {}, {:.1f}x)",
                               format_bytes(r.kv_bytes_per_token_expanded),
                               static_cast<double>(r.kv_bytes_per_token_expanded) /
                                   static_cast<double>(r.kv_bytes_per_token))
                 : std::string());
}

int run_bench_generate(BenchGenerateArgs& a) {
  a.bench.path = a.checkpoint.dir;
  a.bench.engine = engine_options(a.layout);
  a.bench.engine.format = a.checkpoint.model_format();
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
  add_checkpoint_options(cmd, a->checkpoint);
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
  cmd->add_option("--router-skew", a->bench.router_skew,
                  "Zipf exponent s of a bias added to every router's logits (expert popularity ~ 1/rank^s, "
                  "real models measure about 1; 0: the checkpoint's routing)")
      ->capture_default_str()
      ->check(finite_in(0, 16));
  cmd->add_option(
         "--eplb-prompts", a->bench.eplb_prompts,
         "With --redundant-experts: untimed runs on this many other prompts whose expert loads choose "
         "each MoE layer's placement")
      ->capture_default_str()
      ->check(integer_in(1, 1000));
  add_layout_options(cmd, a->layout, true);
  add_json_option(cmd, a->json, "the results");
  table[cmd] = [a] { return run_bench_generate(*a); };
}

}  // namespace expar::cli
