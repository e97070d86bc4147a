#pragma once
// Chat templates: tokenizer_config.json's `chat_template` (Jinja) rendered for a conversation, as
// transformers' apply_chat_template does. A Jinja subset: if/elif/else, for (loop.index, index0, first,
// last, length, revindex, previtem, nextitem; else; `if` filter), set (also ns.attr and block set), macro,
// break/continue; expressions with and/or/not, comparisons, in / not in, is [not] tests, ~, + - * / // % **,
// conditional expressions, slices, literals of lists and dicts; the filters, tests, methods and globals
// (namespace, range, raise_exception, strftime_now) that the families' templates use. Checked against
// @huggingface/jinja (tests/io/chat_template_reference_test). Unsupported constructs are an expar::Error
// naming the construct and its line and column.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace expar {

class Tokenizer;

class ChatTemplate {
 public:
  // Parses the template; throws expar::Error on syntax it does not support.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;

  // Renders with the variables of `context` (messages, add_generation_prompt, bos_token, eos_token,
  // tools...). A raise_exception() of the template is an expar::Error carrying its message.
  std::string render(const nlohmann::json& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// transformers' apply_chat_template(messages, add_generation_prompt=..., tokenize=False): the tokenizer's
// chat template rendered with `messages`, add_generation_prompt, bos_token and eos_token (and the keys of
// `extra`, e.g. tools). Throws expar::Error when the tokenizer has no chat template.
std::string apply_chat_template(const Tokenizer& tokenizer, const nlohmann::json& messages,
                                bool add_generation_prompt,
                                const nlohmann::json& extra = nlohmann::json::object());

}  // namespace expar
