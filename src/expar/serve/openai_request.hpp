#pragma once
// OpenAI-compatible request bodies (POST /v1/completions and /v1/chat/completions) read into what the
// scheduler runs. Every field is type-checked; fields expar does not implement are refused by name when
// they ask for something other than their default (nothing is silently ignored); unknown fields are
// ignored as OpenAI's API does.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/infer/sampling.hpp"
#include "expar/infer/text_codec.hpp"

namespace expar::serve {

struct CompletionParams {
  bool chat = false;
  std::string model;            // as given; empty when absent
  std::vector<int32_t> prompt;  // token ids
  int64_t max_tokens = 16;      // resolved (chat default: the rest of the context)
  infer::SamplingParams sampling;
  std::optional<uint64_t> seed;   // unset: a random stream
  std::vector<std::string> stop;  // stop strings (not returned)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ModelLimits {
  std::string name;     // the served model name
  int64_t vocab = 0;    // token ids must be in [0, vocab)
  int64_t max_seq = 0;  // the context
};

// Throws ApiError (400) naming the field and the rule for a malformed body; `codec` may be nullptr (then
// prompts must be token ids and chat is refused).
CompletionParams parse_completion_request(const std::string& body, bool chat, const infer::TextCodec* codec,
                                          const ModelLimits& limits);

}  // namespace expar::serve
