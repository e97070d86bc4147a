#pragma once
// Text <-> token ids for the server: our byte-level models read and write bytes; a Hugging Face checkpoint
// uses its tokenizer (and chat template) when it has one.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expar/infer/hf_config.hpp"

namespace expar::serve {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
  // The prompt text of a chat (OpenAI `messages`) with the generation prompt appended; nullopt: the model
  // has no chat template.
  virtual std::optional<std::string> chat_prompt(const nlohmann::json& messages) const = 0;
  // Tokens that end a generation (end of sequence); empty: none.
  virtual std::vector<int32_t> stop_tokens() const = 0;
};

// Token i is byte i (our byte-level models: vocabulary 256). No chat template, no end token.
class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  std::optional<std::string> chat_prompt(const nlohmann::json&) const override { return std::nullopt; }
  std::vector<int32_t> stop_tokens() const override { return {}; }
};

// The codec of a checkpoint: bytes for our format; nullptr for a Hugging Face checkpoint without a
// tokenizer (the server then takes token-id prompts only).
std::unique_ptr<TextCodec> text_codec_for(const infer::ModelSpec& spec);

// The length of the longest prefix of `text` that ends on a whole UTF-8 character (a stream holds back a
// character whose bytes have not all been generated yet).
size_t complete_utf8_prefix(const std::string& text);

}  // namespace expar::serve
