#pragma once
// Text prompts through a checkpoint's own tokenizer (shared by `expar generate`; defined in tokenize.cpp).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "expar/io/tokenizer.hpp"

namespace expar::cli {

struct TextPrompt {
  Tokenizer tokenizer;
  std::vector<int32_t> ids;  // the prompt's ids
  bool chat = false;
};

// The prompt encoded by the tokenizer.json of the checkpoint at `checkpoint` (a directory or a file in one),
// or nullopt when it has none (our byte-level checkpoints). `chat`: the prompt is one user message rendered
// by the tokenizer's chat template with the generation prompt (an error when there is no template).
std::optional<TextPrompt> encode_prompt(const std::filesystem::path& checkpoint, const std::string& prompt,
                                        bool chat);

// What generate prints: the prompt and its continuation (plain), or the reply alone (chat); special tokens
// left out.
std::string decode_generated(const TextPrompt& prompt, const std::vector<int32_t>& generated);

}  // namespace expar::cli
