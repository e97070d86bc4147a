#include "expar/topo/refusal.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace expar {

std::string LayoutFix::text() const {
  if (!phrase.empty()) return phrase;
  std::string out;
  for (const auto& [name, value] : with) out += fmt::format("set {}={} and ", name, value);
  if (period > 0)
    return out + fmt::format("choose {} in {{{},...}} (any multiple of {})", setting, fmt::join(values, ","),
                             period);
  if (values.size() == 1) return out + fmt::format("set {}={}", setting, values[0]);
  return out + fmt::format("choose {} in {{{}}}", setting, fmt::join(values, ","));
}

std::string LayoutRefusal::message() const {
  std::string out = rule;
  if (!note.empty()) out += "; " + note;
  for (size_t i = 0; i < fixes.size(); ++i) out += (i == 0 ? ": " : ", or ") + fixes[i].text();
  return out;
}

}  // namespace expar
