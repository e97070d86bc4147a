#pragma once
// GPT-2's byte-to-character table: byte-level vocabularies spell each byte as one printable code point
// (bytes that are printable Latin-1 keep their own code point, the rest map to U+0100 and up).
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace expar::tok {

const std::array<char32_t, 256>& byte_to_char();

// The raw bytes that a byte-level token spells, or nullopt when it holds a code point outside the table.
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// The byte-level spelling of raw bytes (the inverse of byte_level_to_bytes).
std::string bytes_to_byte_level(std::string_view bytes);

}  // namespace expar::tok
