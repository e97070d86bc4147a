#pragma once
// Text prompts through a checkpoint's own text codec (`expar generate`; defined in tokenize.cpp).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "expar/infer/hf_config.hpp"
#include "expar/infer/text_codec.hpp"

namespace expar::cli {

struct TextPrompt {
  std::unique_ptr<infer::TextCodec> codec;  // the checkpoint's, as expar serve uses it
  std::vector<int32_t> ids;                 // the prompt's ids
  bool chat = false;
};

// The prompt encoded by the checkpoint's text codec (infer/text_codec: its tokenizer.json, or bytes for our
// byte-level checkpoints), or nullopt when it has none. `chat`: the prompt is one user message rendered by
// the tokenizer's chat template with the generation prompt (an error when there is no template).
std::optional<TextPrompt> encode_prompt(const infer::ModelSpec& spec, const std::string& prompt, bool chat);

// What generate prints: the prompt and its continuation (plain), or the reply alone (chat); special tokens
// left out.
std::string decode_generated(const TextPrompt& prompt, const std::vector<int32_t>& generated);

}  // namespace expar::cli
