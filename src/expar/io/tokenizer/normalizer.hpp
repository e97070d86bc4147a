#pragma once
// tokenizer.json's "normalizer": the text rewrites applied to each piece of text between added tokens
// before it is split. Supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace expar::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null; throws expar::Error naming an unsupported or malformed component.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

// Replaces every match of a tokenizer.json pattern ({"String": s} or {"Regex": r}) with `content`; shared by
// the Replace normalizer, pre-tokenizer and decoder.
class Replacer {
 public:
  Replacer(const nlohmann::json& pattern, std::string content, std::string_view label);
  ~Replacer();
  Replacer(Replacer&&) noexcept;
  std::string apply(std::string_view text) const;

 private:
  std::string literal_;
  std::unique_ptr<class Regex> regex_;
  std::string content_;
};

}  // namespace expar::tok
