// The text codec of a checkpoint (text_codec_for), and the tokenizer-backed one (a separate file from
// text_codec.cpp so that the request fuzzer links without the tokenizer's PCRE2 and ICU).
#include "expar/infer/text_codec.hpp"
#include "expar/io/chat_template.hpp"
#include "expar/io/tokenizer.hpp"

namespace expar::infer {
namespace {

// A Hugging Face checkpoint's tokenizer.json and chat template, used as transformers and vLLM do:
// completion prompts get the post-processor's special tokens (e.g. a BOS), chat prompts are the rendered
// template as written (it spells its own special tokens), output text leaves special tokens out, and the
// eos token ends a generation.
class TokenizerCodec final : public TextCodec {
 public:
  explicit TokenizerCodec(Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {
    if (tokenizer_.eos_token())
      if (std::optional<int32_t> id = tokenizer_.token_to_id(*tokenizer_.eos_token())) stop_.push_back(*id);
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    return tokenizer_.encode(text, true);
  }
  std::string decode(std::span<const int32_t> tokens) const override {
    return tokenizer_.decode(tokens, true);
  }
  std::optional<std::string> chat_prompt(const nlohmann::json& messages) const override {
    if (tokenizer_.chat_template().empty()) return std::nullopt;
    return apply_chat_template(tokenizer_, messages, /*add_generation_prompt=*/true);
  }
  std::vector<int32_t> encode_chat(const std::string& text) const override {
    return tokenizer_.encode(text, false);
  }
  std::vector<int32_t> stop_tokens() const override { return stop_; }

 private:
  Tokenizer tokenizer_;
  std::vector<int32_t> stop_;
};

}  // namespace

std::unique_ptr<TextCodec> text_codec_for(const ModelSpec& spec) {
  if (Tokenizer::present_in(spec.dir))
    return std::make_unique<TokenizerCodec>(Tokenizer::from_path(spec.dir));
  if (spec.format == ModelFormat::Expar && spec.config.vocab == 256) return std::make_unique<ByteCodec>();
  return nullptr;
}

}  // namespace expar::infer
