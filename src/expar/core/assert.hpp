#pragma once
// EXPAR_ASSERT: internal invariants, as opposed to EXPAR_CHECK (core/error.hpp) for what a user can cause.
//
//  - EXPAR_CHECK(cond, fmt, args...): a flag, a config, a file the user gave: the message names the value,
//    the rule and the fix.
//  - EXPAR_ASSERT(cond, fmt, args...): an invariant no input can break (a shape the code itself built, an
//    index the layout computed, every member of a group passing the same count): the message starts
//    "internal error at FILE:LINE" and names the condition, so it reads as a bug in expar. It is still an
//    exception (expar::InternalError, an expar::Error), so the rank that hits it goes down the way a user
//    error does and its peers are woken with the message.
#include <string>

#include "expar/core/error.hpp"

namespace expar {

// A broken internal invariant (see EXPAR_ASSERT).
class InternalError : public Error {
 public:
  using Error::Error;
};

// "internal error at FILE:LINE: `CONDITION` does not hold: DETAIL (a bug in expar, not in the input)".
template <typename... Args>
[[noreturn]] void fail_internal(const char* file, int line, const char* condition,
                                fmt::format_string<Args...> format, Args&&... args) {
  throw InternalError(
      fmt::format("internal error at {}:{}: `{}` does not hold: {} (a bug in expar, not in the input)", file,
                  line, condition, fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace expar

// EXPAR_ASSERT(cond, "fmt", args...): throws expar::InternalError naming file:line and cond when cond is
// false.
#define EXPAR_ASSERT(cond, ...)                                       \
  do {                                                                \
    if (!(cond)) {                                                    \
      ::expar::fail_internal(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    }                                                                 \
  } while (0)
