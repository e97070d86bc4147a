#include "expar/io/tokenizer/byte_level.hpp"

#include "expar/io/tokenizer/utf8.hpp"

namespace expar::tok {

namespace {

std::array<char32_t, 256> make_table() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

// Inverse table: the code points used are all below 0x144.
std::array<int, 0x144> make_inverse() {
  std::array<int, 0x144> inverse{};
  inverse.fill(-1);
  const auto& table = byte_to_char();
  for (int b = 0; b < 256; ++b) inverse[table[b]] = b;
  return inverse;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = make_table();
  return table;
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  static const std::array<int, 0x144> inverse = make_inverse();
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= inverse.size() || inverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_to_char()[b]);
  return out;
}

}  // namespace expar::tok
