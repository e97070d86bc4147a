#pragma once
// expar::Error: every user-facing failure. Messages name the value, the rule it broke and the fix, e.g.
// "num_experts=6 is not divisible by ep_degree=4: choose ep_degree in {1,2}" (TP 4: each suggested value is
// one the whole validation accepts; topo/refusal.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace expar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace expar

// EXPAR_CHECK(cond, "fmt", args...): throws expar::Error with the formatted message when cond is false.
#define EXPAR_CHECK(cond, ...)    \
  do {                            \
    if (!(cond)) {                \
      ::expar::fail(__VA_ARGS__); \
    }                             \
  } while (0)
