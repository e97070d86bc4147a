#pragma once
// UTF-8 helpers of the tokenizer: code point iteration, encoding, and the lossy decoding that both
// reference implementations apply to decoded bytes (invalid sequences become U+FFFD, one per maximal
// subpart, as the WHATWG TextDecoder and Rust's String::from_utf8_lossy do).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace expar::tok {

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for invalid leads, so iteration advances).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// The code point at s[i] (valid UTF-8 assumed: the text was validated on entry); advances i past it.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(i);
  const size_t n = std::min(utf8_length(lead), s.size() - i);
  char32_t cp = n == 1 ? lead : n == 2 ? (lead & 0x1F) : n == 3 ? (lead & 0x0F) : (lead & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(i + k) & 0x3F);
  i += n;
  return cp;
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Byte offset of the first invalid UTF-8 sequence in s, or npos when s is valid UTF-8.
size_t first_invalid_utf8(std::string_view s);

// s with every maximal invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view s);

// Unicode White_Space (what `\s` means in the reference regexes and what trim removes).
bool is_white_space(char32_t cp);

// `s` without the code points that `strip(cp)` accepts at its start (`left`) and end (`right`).
template <typename Pred>
std::string_view strip_code_points(std::string_view s, bool left, bool right, Pred&& strip) {
  size_t begin = 0, end = s.size();
  if (left)
    for (size_t i = 0; i < end;) {
      if (!strip(next_code_point(s, i))) break;
      begin = i;
    }
  if (right)
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t i = start;
      if (!strip(next_code_point(s, i))) break;
      end = start;
    }
  return s.substr(begin, end - begin);
}

inline std::string_view trim_white_space(std::string_view s, bool left = true, bool right = true) {
  return strip_code_points(s, left, right, is_white_space);
}

}  // namespace expar::tok
