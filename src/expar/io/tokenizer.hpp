#pragma once
// expar::Tokenizer: text <-> token ids as a Hugging Face tokenizer.json (+ tokenizer_config.json) defines
// them: added tokens matched first, then normalizer -> pre-tokenizer -> BPE model -> post-processor to
// encode, and decoder (+ clean-up) to decode. Checked id for id against @huggingface/tokenizers on the
// GPT-2, Llama-2, Llama-3, Qwen3, DeepSeek-V3 and gpt-oss vocabularies (tests/io/tokenizer_reference_test).
// A component that a file uses and expar does not implement is an expar::Error naming it.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace expar {

class Tokenizer {
 public:
  // `tokenizer_json`: the text of tokenizer.json; `config_json`: the text of tokenizer_config.json or empty.
  // `label` names the source in error messages.
  Tokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view label);
  // A tokenizer.json file, or a directory holding one; tokenizer_config.json beside it is read when present,
  // and chat_template.jinja when the config has no chat_template.
  static Tokenizer from_path(const std::filesystem::path& file_or_dir);
  // Whether `dir` (or the directory of a file in it) holds a tokenizer.json.
  static bool present_in(const std::filesystem::path& file_or_dir);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // `add_special_tokens`: let the post-processor add its tokens (e.g. Llama-2's <s>). Added and special
  // tokens written in the text are always recognized. Throws expar::Error on text that is not UTF-8.
  // Safe to call from several threads at once.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // `skip_special_tokens`: leave out special tokens. Throws expar::Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The token as the vocabulary spells it (byte-level vocabularies spell bytes as GPT-2 characters).
  const std::string& id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // One past the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;

  // tokenizer_config.json: the chat template (empty when there is none) and the bos/eos token texts.
  const std::string& chat_template() const;
  const std::optional<std::string>& bos_token() const;
  const std::optional<std::string>& eos_token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace expar
