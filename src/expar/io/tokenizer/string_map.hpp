#pragma once
// A string -> token id map that looks up string_views without building a std::string.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace expar::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

inline int32_t find_id(const TokenIdMap& map, std::string_view key) {
  auto it = map.find(key);
  return it == map.end() ? -1 : it->second;
}

}  // namespace expar::tok
