#include "expar/comm/comm_env.hpp"

#include <cstdlib>
#include <string>

#include "expar/core/error.hpp"

namespace expar {

double comm_timeout_seconds(double fallback) {
  const char* text = std::getenv("EXPAR_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  EXPAR_CHECK(end != text && *end == '\0' && value > 0,
              "EXPAR_COMM_TIMEOUT='{}' is not a positive number of seconds: set it to e.g. 60 or unset it",
              text);
  return value;
}

}  // namespace expar
