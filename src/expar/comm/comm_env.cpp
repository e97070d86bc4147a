#include "expar/comm/comm_env.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

#include "expar/core/error.hpp"

namespace expar {

double comm_timeout_seconds(double fallback) {
  const char* text = std::getenv("EXPAR_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  // A deadline must be reachable: inf or 1e300 s would overflow the clock arithmetic of every wait.
  constexpr double kMaxSeconds = 1e6;
  EXPAR_CHECK(
      end != text && *end == '\0' && std::isfinite(value) && value > 0 && value <= kMaxSeconds,
      "EXPAR_COMM_TIMEOUT='{}' is not a finite positive number of seconds up to {:g}: set it to e.g. 60 "
      "or unset it (default {} s)",
      text, kMaxSeconds, fallback);
  return value;
}

}  // namespace expar
