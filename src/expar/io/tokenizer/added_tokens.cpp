#include "expar/io/tokenizer/added_tokens.hpp"

#include "expar/io/tokenizer/regex.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar::tok {

namespace {

uint64_t edge(int32_t node, unsigned char byte) {
  return (static_cast<uint64_t>(node) << 8) | byte;
}

// A letter, digit or underscore: what single_word tokens must not touch.
bool is_word_char(std::string_view s) {
  static const Regex word(R"(^[\p{L}\p{N}\p{M}_])", "single_word");
  return word.find(s, 0).first == 0;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  terminal_.push_back(-1);
  for (size_t t = 0; t < patterns_.size(); ++t) {
    const std::string& p = patterns_[t];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char b : p) {
      auto [it, inserted] = children_.emplace(edge(node, b), static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    // The first token listed for a text keeps it (a later duplicate would be unreachable anyway).
    if (terminal_[static_cast<size_t>(node)] < 0)
      terminal_[static_cast<size_t>(node)] = static_cast<int32_t>(t);
  }
}

int AddedTokenMatcher::match_at(std::string_view text, size_t pos, size_t& length) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = children_.find(edge(node, static_cast<unsigned char>(text[i])));
    if (it == children_.end()) break;
    node = it->second;
    const int32_t t = terminal_[static_cast<size_t>(node)];
    if (t < 0) continue;
    const AddedToken& token = tokens_[static_cast<size_t>(t)];
    const size_t end = i + 1;
    if (token.single_word) {
      size_t prev_start = pos;
      if (pos > 0) {
        prev_start = pos - 1;
        while (prev_start > 0 && (static_cast<unsigned char>(text[prev_start]) & 0xC0) == 0x80) --prev_start;
      }
      const bool word_before = pos > 0 && is_word_char(text.substr(prev_start));
      const bool word_after = end < text.size() && is_word_char(text.substr(end));
      if (word_before || word_after) continue;
    }
    best = t;
    length = end - pos;
  }
  return best;
}

std::vector<Section> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Section> out;
  if (tokens_.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int t = match_at(text, pos, length);
    if (t < 0) {
      ++pos;
      continue;
    }
    if (pos > last) out.push_back({text.substr(last, pos - last), -1});
    out.push_back({text.substr(pos, length), t});
    pos += length;
    last = pos;
  }
  if (last < text.size()) out.push_back({text.substr(last), -1});
  // lstrip / rstrip: the whitespace next to the token belongs to it, so it leaves the neighbouring text.
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].token < 0) continue;
    const AddedToken& token = tokens_[static_cast<size_t>(out[i].token)];
    if (token.lstrip && i > 0 && out[i - 1].token < 0)
      out[i - 1].text = trim_white_space(out[i - 1].text, false, true);
    if (token.rstrip && i + 1 < out.size() && out[i + 1].token < 0)
      out[i + 1].text = trim_white_space(out[i + 1].text, true, false);
  }
  std::erase_if(out, [](const Section& s) { return s.token < 0 && s.text.empty(); });
  return out;
}

}  // namespace expar::tok
