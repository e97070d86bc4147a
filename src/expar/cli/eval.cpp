// `expar eval`: mean next-token cross-entropy and perplexity of a checkpoint (ours, or a Hugging Face
// Mixtral, Qwen-MoE, Qwen3-MoE, OLMoE or gpt-oss directory) over a token file (infer/evaluate.hpp), on any
// inference layout (TP x DP ranks as threads, EP full, variable or off).
#include <fmt/format.h>

#include <cstdio>

#include "expar/cli/checkpoint_flags.hpp"
#include "expar/cli/commands.hpp"
#include "expar/cli/layout_options.hpp"
#include "expar/cli/load_report.hpp"
#include "expar/core/error.hpp"
#include "expar/infer/evaluate.hpp"
#include "expar/io/token_file.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar::cli {

namespace {

struct EvalArgs {
  CheckpointArgs checkpoint;  // --checkpoint, --format
  std::string data;
  int64_t tokens = 0;  // 0: the whole file
  int64_t window = 0;  // 0: the model's max_position_embeddings
  LayoutArgs layout;
};

int run_eval(const EvalArgs& a) {
  EXPAR_CHECK(!a.data.empty(), "expar eval needs tokens: pass --data <token file>");
  EXPAR_CHECK(a.tokens >= 0, "--tokens {} must not be negative (0: the whole file)", a.tokens);
  EXPAR_CHECK(a.window >= 0, "--window {} must not be negative (0: the model's context)", a.window);
  // A text file goes through the checkpoint's tokenizer when it has one (else its bytes are the tokens).
  const infer::ModelSpec spec = infer::open_model_spec(a.checkpoint.dir, a.checkpoint.model_format());
  std::optional<Tokenizer> tokenizer;
  if (Tokenizer::present_in(spec.dir)) tokenizer.emplace(Tokenizer::from_path(spec.dir));
  TokenFile file = read_token_file(a.data, tokenizer ? &*tokenizer : nullptr);
  EXPAR_CHECK(a.tokens == 0 || a.tokens <= static_cast<int64_t>(file.tokens.size()),
              "--tokens {} exceeds the {} tokens of '{}': pass at most {} (or 0 for all)", a.tokens,
              file.tokens.size(), a.data, file.tokens.size());
  if (a.tokens > 0) file.tokens.resize(static_cast<size_t>(a.tokens));
  infer::EvaluateOptions o;
  o.engine = engine_options(a.layout);
  o.engine.format = a.checkpoint.model_format();
  o.window = a.window;
  const LoadReport report("expar eval", spec, o.engine, o.window > 0 ? o.window : spec.config.max_seq);
  const infer::EvaluateResult r = infer::evaluate(o, a.checkpoint.dir, file.tokens);
  fmt::print("loss {:.6f} nats/token, perplexity {:.4f} over {} predicted tokens ({} windows)\n", r.mean_loss,
             r.perplexity, r.predicted, r.windows);
  fmt::print(stderr, "[{}, {} data, TP {} x DP {}, EP {}: {:.1f} tokens/s]\n",
             infer::model_format_name(r.format), file.kind, a.layout.tp, a.layout.dp,
             ep_label(a.layout.enable_expert_parallel, r.ep_degree, a.layout.tp, a.layout.dp),
             r.tokens_per_s);
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("eval", "Next-token loss and perplexity of a checkpoint over a token file");
  auto a = std::make_shared<EvalArgs>();
  add_checkpoint_options(cmd, a->checkpoint);
  cmd->add_option("--data", a->data,
                  "Tokens: a text file (bytes), little-endian uint16/uint32 with a FILE.json sidecar {dtype, "
                  "vocab_size}, or a .npy");
  cmd->add_option("--tokens", a->tokens, "Evaluate the first N tokens (0: all)")->capture_default_str();
  cmd->add_option("--window", a->window, "Context tokens per window (0: max_position_embeddings)")
      ->capture_default_str();
  add_layout_options(cmd, a->layout, false);
  table[cmd] = [a] { return run_eval(*a); };
}

}  // namespace expar::cli
