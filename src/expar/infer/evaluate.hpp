#pragma once
// `expar eval`: mean next-token cross-entropy and perplexity of a checkpoint over a token stream, on any
// inference layout. The stream is cut into consecutive windows of `window` + 1 tokens that overlap by one
// token (window k holds tokens [k·window, (k+1)·window]), so every token after the first is predicted exactly
// once, from the tokens of its window before it. Each window is one prefill on the engine (logits of every
// row); DP replicas take windows in turn (replica r: windows r, r + DP, ...; a replica without a window runs
// the DP-padding step). The loss is summed in double.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/infer/generate.hpp"

namespace expar::infer {

struct EvaluateOptions {
  GenerateOptions engine;  // layout, format and threads (decode_moe is unused: evaluation only prefills)
  int64_t window = 0;      // tokens of context per window; 0: the model's max_position_embeddings
};

struct EvaluateResult {
  ModelFormat format = ModelFormat::Expar;
  int ep_degree = 1;      // the layout's (1: no EP)
  int64_t predicted = 0;  // tokens scored (the stream's length - 1)
  int64_t windows = 0;
  double mean_loss = 0.0;     // nats per predicted token
  double perplexity = 0.0;    // exp(mean_loss)
  double tokens_per_s = 0.0;  // prefill tokens per second over the whole run
};

// Throws expar::Error when fewer than 2 tokens are given, a token is not below the model's vocabulary (naming
// its index and value), or the window is not in [1, max_seq].
EvaluateResult evaluate(const EvaluateOptions& options, const std::string& checkpoint,
                        const std::vector<int32_t>& tokens);

// -log softmax(logits)[target] in double, for one row of logits [V].
double token_loss(const float* logits, int64_t vocab, int32_t target);

}  // namespace expar::infer
