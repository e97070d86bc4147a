#include "expar/infer/text_codec.hpp"

namespace expar::infer {

std::vector<int32_t> ByteCodec::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteCodec::decode(std::span<const int32_t> tokens) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i)
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  return text;
}

size_t complete_utf8_prefix(const std::string& text) {
  const size_t n = text.size();
  // Look back over at most 3 continuation bytes for the lead byte of the last character.
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return back >= need ? n : n - back;
  }
  return n;  // only continuation bytes at the end: not valid UTF-8 anyway, pass it through
}

}  // namespace expar::infer
