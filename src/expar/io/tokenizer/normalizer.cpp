#include "expar/io/tokenizer/normalizer.hpp"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "expar/io/tokenizer/json_fields.hpp"
#include "expar/io/tokenizer/regex.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar::tok {

namespace {

constexpr const char* kSupported = "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend";

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// ICU's normalizers work on UTF-8 directly; ASCII is invariant under all four forms, which is the common
// case and skips ICU entirely.
class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(const std::string& form) : form_(form) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") normalizer_ = icu::Normalizer2::getNFCInstance(status);
    if (form == "NFD") normalizer_ = icu::Normalizer2::getNFDInstance(status);
    if (form == "NFKC") normalizer_ = icu::Normalizer2::getNFKCInstance(status);
    if (form == "NFKD") normalizer_ = icu::Normalizer2::getNFKDInstance(status);
    EXPAR_CHECK(U_SUCCESS(status) && normalizer_ != nullptr, "ICU has no {} normalizer ({})", form,
                u_errorName(status));
  }
  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;
    UErrorCode status = U_ZERO_ERROR;
    if (normalizer_->isNormalizedUTF8(text, status) && U_SUCCESS(status)) return;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    status = U_ZERO_ERROR;
    normalizer_->normalizeUTF8(0, text, sink, nullptr, status);
    EXPAR_CHECK(U_SUCCESS(status), "{} normalization of a {}-byte text failed ({})", form_, text.size(),
                u_errorName(status));
    text = std::move(out);
  }

 private:
  std::string form_;
  const icu::Normalizer2* normalizer_ = nullptr;
};

// Full Unicode lower-casing with the root locale, as JavaScript's toLowerCase and Rust's to_lowercase do.
class Lowercase : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (is_ascii(text)) {
      for (char& c : text) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      return;
    }
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    u.toLower(icu::Locale::getRoot());
    text.clear();
    u.toUTF8String(text);
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    text = std::string(trim_white_space(text, left_, right_));
  }

 private:
  bool left_, right_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  // Rust's and JavaScript's Prepend add nothing to an empty text (JavaScript never calls it on one).
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  explicit Replace(const nlohmann::json& config)
      : replacer_(config.value("pattern", nlohmann::json::object()),
                  field_or<std::string>(config, "content", "", "normalizer Replace"), "normalizer Replace") {}
  void normalize(std::string& text) const override { text = replacer_.apply(text); }

 private:
  Replacer replacer_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

Replacer::Replacer(const nlohmann::json& pattern, std::string content, std::string_view label)
    : content_(std::move(content)) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    literal_ = pattern["String"].get<std::string>();
    EXPAR_CHECK(!literal_.empty(), "tokenizer.json: {} has an empty String pattern: give the text to replace",
                label);
  } else if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), label);
  } else {
    fail("tokenizer.json: {} pattern {} is neither {{\"String\": ...}} nor {{\"Regex\": ...}}", label,
         json_excerpt(pattern));
  }
}

Replacer::~Replacer() = default;
Replacer::Replacer(Replacer&&) noexcept = default;

std::string Replacer::apply(std::string_view text) const {
  std::string out;
  size_t last = 0;
  if (regex_) {
    regex_->for_each_match(text, [&](size_t b, size_t e) {
      out.append(text.substr(last, b - last));
      out.append(content_);
      last = e;
    });
  } else {
    for (size_t at = text.find(literal_); at != std::string_view::npos; at = text.find(literal_, last)) {
      out.append(text.substr(last, at - last));
      out.append(content_);
      last = at + literal_.size();
    }
  }
  out.append(text.substr(last));
  return out;
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = component_type(config, "normalizer");
  if (type == "Sequence")
    return std::make_unique<Sequence>(
        sequence_steps<Normalizer>(config, "normalizers", "normalizer",
                                   [](const nlohmann::json& item) { return make_normalizer(item); }));
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD")
    return std::make_unique<UnicodeForm>(type);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip")
    return std::make_unique<Strip>(field_or(config, "strip_left", true, "normalizer Strip"),
                                   field_or(config, "strip_right", true, "normalizer Strip"));
  if (type == "Prepend")
    return std::make_unique<Prepend>(field_or<std::string>(config, "prepend", "", "normalizer Prepend"));
  if (type == "Replace") return std::make_unique<Replace>(config);
  unsupported("normalizer", type, kSupported);
}

}  // namespace expar::tok
