#pragma once
// Text <-> token ids of a checkpoint, for expar serve and expar generate alike: a checkpoint with a
// tokenizer.json uses it (and its chat template); our byte-level models read and write bytes.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expar/infer/hf_config.hpp"

namespace expar::infer {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
  // The prompt text of a chat (OpenAI `messages`) with the generation prompt appended; nullopt: the model
  // has no chat template.
  virtual std::optional<std::string> chat_prompt(const nlohmann::json& messages) const = 0;
  // The ids of a rendered chat prompt (no special tokens added: the template writes its own).
  virtual std::vector<int32_t> encode_chat(const std::string& text) const { return encode(text); }
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

// The codec of a checkpoint: its tokenizer.json (and chat template) when the directory has one; bytes for
// our byte-level format; nullptr otherwise (the server then takes token-id prompts only).
std::unique_ptr<TextCodec> text_codec_for(const ModelSpec& spec);

// The length of the longest prefix of `text` that ends on a whole UTF-8 character (a stream holds back a
// character whose bytes have not all been generated yet).
size_t complete_utf8_prefix(const std::string& text);

}  // namespace expar::infer
