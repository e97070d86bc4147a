#include "expar/cli/shape_flags.hpp"

#include "expar/cli/option_checks.hpp"

namespace expar::cli {

void retire_top_k(CLI::App* cmd) {
  retire_option(cmd, "--top-k", "--experts-per-token",
                "--top-k is sampling's (expar generate); the routes per token are --experts-per-token");
}

void add_layer_shape_flags(CLI::App* cmd, int64_t& model_dim, int64_t& hidden_dim, int& experts, int& top_k,
                           const std::string& d_help, const std::string& h_help) {
  cmd->add_option("--d-model", model_dim, d_help)->check(integer_in(1, 1 << 16));
  cmd->add_option("--expert-hidden", hidden_dim, h_help)->check(integer_in(1, 1 << 16));
  cmd->add_option("--experts", experts, "routed experts E")->check(integer_in(1, 4096));
  add_experts_per_token_flag(cmd, top_k, "routes per token K", 4096);
  for (const char* old : {"--d", "--dim"})
    retire_option(cmd, old, "--d-model", "the model dimension is --d-model in every command");
  retire_option(cmd, "--h", "--expert-hidden",
                "the expert hidden dimension is --expert-hidden in every command");
}

void add_layer_bench_flags(CLI::App* cmd, bench::LayerBenchSetup& s, const LayerBenchHelp& help) {
  if (!help.ranks.empty()) cmd->add_option("--ranks", s.ranks, help.ranks)->check(integer_in(1, 256));
  if (!help.threads.empty()) cmd->add_option("--threads", s.threads, help.threads)->check(integer_in(1, 256));
  cmd->add_option("--tokens", s.tokens, help.tokens)->check(integer_in(1, 1 << 20));
  add_layer_shape_flags(cmd, s.model_dim, s.hidden_dim, s.experts, s.top_k, help.d, help.h);
  cmd->add_option("--repeats", s.repeats, "measured repeats (the median is reported)")
      ->check(integer_in(1, 1000));
  cmd->add_option("--warmup", s.warmup, "warm-up repeats before measuring")->check(integer_in(0, 1000));
  cmd->add_option("--seed", s.seed, "seed of inputs and weights");
  cmd->add_flag("--oversubscribe", s.oversubscribe, "allow ranks x threads above the cores");
}

}  // namespace expar::cli
