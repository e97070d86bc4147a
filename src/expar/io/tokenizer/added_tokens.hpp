#pragma once
// Added tokens ("added_tokens" of tokenizer.json): matched in the text before normalization and splitting
// (those with normalized=false) or in the normalized text (normalized=true), longest match first at the
// leftmost position, honouring single_word (no word character on either side) and lstrip/rstrip (the
// whitespace beside the token goes with it).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace expar::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A piece of text between added tokens (token < 0) or one added token (its index in the matcher's list).
struct Section {
  std::string_view text;
  int token = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is the text that stands for tokens[i] (its content, or its normalized content).
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  // Splits `text` into sections; the text sections are views of `text`.
  std::vector<Section> split(std::string_view text) const;
  const AddedToken& token(int index) const { return tokens_[static_cast<size_t>(index)]; }
  bool empty() const { return tokens_.empty(); }

 private:
  // The longest pattern that matches at `pos` and passes single_word, or -1.
  int match_at(std::string_view text, size_t pos, size_t& length) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  // Byte trie: node -> child per byte; terminal[node] = token index or -1.
  std::unordered_map<uint64_t, int32_t> children_;
  std::vector<int32_t> terminal_;
  bool first_byte_[256] = {};
};

}  // namespace expar::tok
