#pragma once
// A PCRE2 pattern compiled for UTF-8 text with Unicode properties (UTF + UCP, so \s, \p{L}, \p{N} mean
// what they mean in the Oniguruma patterns of tokenizer.json files) and JIT-compiled for speed.
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace expar::tok {

class Regex {
 public:
  // Throws expar::Error naming `label`, the pattern, PCRE2's message and its offset when it does not compile.
  Regex(std::string_view pattern, std::string_view label, bool caseless = false);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match at or after `from` in `text`: [begin, end) byte offsets, or {npos, npos} when none.
  std::pair<size_t, size_t> find(std::string_view text, size_t from) const;

  // Calls fn(begin, end) for each non-overlapping match, left to right (an empty match advances one
  // code point, as JavaScript's matchAll and Rust's find_iter do).
  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    size_t from = 0;
    while (from <= text.size()) {
      auto [b, e] = find(text, from);
      if (b == std::string_view::npos) break;
      fn(b, e);
      if (e == b) {
        if (e >= text.size()) break;
        from = e + 1;
        while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
      } else {
        from = e;
      }
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace expar::tok
