#include "expar/io/tokenizer/pre_tokenizer.hpp"

#include <algorithm>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/io/tokenizer/json_fields.hpp"
#include "expar/io/tokenizer/regex.hpp"

namespace expar::tok {

namespace {

constexpr const char* kSupported = "Sequence, Split, ByteLevel, Metaspace, Digits";

// GPT-2's word pattern, which ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior behavior_from_name(const std::string& name) {
  if (name == "Removed") return Behavior::Removed;
  if (name == "Isolated") return Behavior::Isolated;
  if (name == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::MergedWithNext;
  if (name == "Contiguous") return Behavior::Contiguous;
  fail(
      "tokenizer.json: Split behavior {:?} is not one of Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, "
      "Contiguous",
      name);
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Cuts `text` at the matches of a pattern, per Rust tokenizers' SplitDelimiterBehavior; empty pieces go.
void split_by_behavior(const std::string& text, const std::vector<Span>& spans, Behavior behavior,
                       std::vector<std::string>& out) {
  std::vector<Span> kept;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) kept.push_back(s);
      break;
    case Behavior::Isolated:
      kept = spans;
      break;
    case Behavior::MergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty())
          kept.back().end = s.end;
        else
          kept.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty())
          kept.back().begin = it->begin;
        else
          kept.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case Behavior::Contiguous:
      for (const Span& s : spans) {
        if (!kept.empty() && s.is_match == previous_match)
          kept.back().end = s.end;
        else
          kept.push_back(s);
        previous_match = s.is_match;
      }
      break;
  }
  for (const Span& s : kept)
    if (s.end > s.begin) out.emplace_back(text, s.begin, s.end - s.begin);
}

class Split : public PreTokenizer {
 public:
  explicit Split(const nlohmann::json& config) {
    const char* what = "pre_tokenizer Split";
    behavior_ = behavior_from_name(field_or<std::string>(config, "behavior", "", what));
    invert_ = field_or(config, "invert", false, what);
    const auto& pattern = config.value("pattern", nlohmann::json::object());
    if (pattern.contains("String") && pattern["String"].is_string()) {
      literal_ = pattern["String"].get<std::string>();
      EXPAR_CHECK(!literal_.empty(), "tokenizer.json: pre_tokenizer Split has an empty String pattern");
    } else if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex_ =
          std::make_unique<Regex>(pattern["Regex"].get<std::string>(), "tokenizer.json pre_tokenizer Split");
    } else {
      fail(
          "tokenizer.json: pre_tokenizer Split pattern {} is neither {{\"String\": ...}} nor {{\"Regex\": "
          "...}}",
          json_excerpt(pattern));
    }
  }
  // The hot path of encoding: Isolated splits (every family's pattern) append pieces directly.
  void split(std::vector<std::string>& words, size_t) const override {
    thread_local std::vector<std::string> out;
    thread_local std::vector<Span> spans;
    out.clear();
    for (const std::string& word : words) {
      spans.clear();
      size_t last = 0;
      const auto on_match = [&](size_t b, size_t e) {
        if (b > last) spans.push_back({last, b, invert_});
        spans.push_back({b, e, !invert_});
        last = e;
      };
      if (regex_) {
        regex_->for_each_match(word, on_match);
      } else {
        for (size_t at = word.find(literal_); at != std::string::npos; at = word.find(literal_, last))
          on_match(at, at + literal_.size());
      }
      if (last < word.size()) spans.push_back({last, word.size(), invert_});
      if (behavior_ == Behavior::Isolated) {
        for (const Span& s : spans)
          if (s.end > s.begin) out.emplace_back(word, s.begin, s.end - s.begin);
      } else {
        split_by_behavior(word, spans, behavior_, out);
      }
    }
    words.swap(out);
  }

 private:
  Behavior behavior_ = Behavior::Isolated;
  bool invert_ = false;
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

class ByteLevel : public PreTokenizer {
 public:
  explicit ByteLevel(const nlohmann::json& config) {
    const char* what = "pre_tokenizer ByteLevel";
    add_prefix_space_ = field_or(config, "add_prefix_space", false, what);
    if (field_or(config, "use_regex", true, what)) {
      nlohmann::json split = {{"type", "Split"},
                              {"pattern", {{"Regex", kGpt2Pattern}}},
                              {"behavior", "Isolated"},
                              {"invert", false}};
      regex_split_ = std::make_unique<Split>(split);
    }
  }
  void split(std::vector<std::string>& words, size_t section) const override {
    if (add_prefix_space_)
      for (std::string& w : words)
        if (w.empty() || w[0] != ' ') w.insert(w.begin(), ' ');
    if (regex_split_) regex_split_->split(words, section);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_ = false;
  std::unique_ptr<Split> regex_split_;
};

// SentencePiece's word boundary marker: spaces become `replacement` (U+2581 by default), a prefix is added
// per prepend_scheme, and with split (the default) each word starts at a marker.
class Metaspace : public PreTokenizer {
 public:
  explicit Metaspace(const nlohmann::json& config) {
    const char* what = "pre_tokenizer Metaspace";
    replacement_ = field_or<std::string>(config, "replacement", "\u2581", what);
    split_ = field_or(config, "split", true, what);
    std::string scheme = field_or<std::string>(config, "prepend_scheme", "", what);
    if (scheme.empty()) scheme = field_or(config, "add_prefix_space", true, what) ? "always" : "never";
    EXPAR_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
                "tokenizer.json: pre_tokenizer Metaspace prepend_scheme {:?} is not always, first or never",
                scheme);
    scheme_ = scheme;
  }
  void split(std::vector<std::string>& words, size_t section) const override {
    std::vector<std::string> out;
    for (std::string& w : words) {
      std::string s;
      for (char c : w) {
        if (c == ' ')
          s += replacement_;
        else
          s.push_back(c);
      }
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && section == 0);
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s.insert(0, replacement_);
      if (!split_) {
        out.push_back(std::move(s));
        continue;
      }
      size_t begin = 0;
      for (size_t at = s.find(replacement_, 1); at != std::string::npos; at = s.find(replacement_, at + 1)) {
        if (at > begin) out.emplace_back(s, begin, at - begin);
        begin = at;
      }
      if (begin < s.size()) out.emplace_back(s, begin, s.size() - begin);
    }
    words.swap(out);
  }

 private:
  std::string replacement_, scheme_;
  bool split_ = true;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::vector<std::string>& words, size_t section) const override {
    for (const auto& step : steps_) step->split(words, section);
  }
  bool byte_level() const override {
    for (const auto& step : steps_)
      if (step->byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = component_type(config, "pre_tokenizer");
  if (type == "Sequence")
    return std::make_unique<Sequence>(
        sequence_steps<PreTokenizer>(config, "pretokenizers", "pre_tokenizer",
                                     [](const nlohmann::json& item) { return make_pre_tokenizer(item); }));
  if (type == "Split") return std::make_unique<Split>(config);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(config);
  if (type == "Metaspace") return std::make_unique<Metaspace>(config);
  if (type == "Digits") {
    const bool individual = field_or(config, "individual_digits", false, "pre_tokenizer Digits");
    return std::make_unique<Split>(nlohmann::json{{"type", "Split"},
                                                  {"pattern", {{"Regex", individual ? "\\p{N}" : "\\p{N}+"}}},
                                                  {"behavior", "Isolated"},
                                                  {"invert", false}});
  }
  unsupported("pre_tokenizer", type, kSupported);
}

}  // namespace expar::tok
