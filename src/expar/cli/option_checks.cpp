#include "expar/cli/option_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "expar/core/error.hpp"

namespace expar::cli {
namespace {

// The number in `text`, or nullopt when it is not one (trailing characters included).
bool parse_double(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

bool parse_integer(const std::string& text, int64_t& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end != text.c_str() + text.size() || errno == ERANGE) return false;
  value = v;
  return true;
}

CLI::Validator finite_range(double lo, double hi, bool open_low) {
  const std::string rule = fmt::format("a finite number in {}{:g}, {:g}]", open_low ? "(" : "[", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!parse_double(text, v)) return fmt::format("'{}' is not a number: pass {}", text, rule);
        const bool ok = std::isfinite(v) && (open_low ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : fmt::format("{} is out of range: pass {}", text, rule);
      },
      rule);
}

}  // namespace

CLI::Validator finite_in(double lo, double hi) {
  return finite_range(lo, hi, false);
}

CLI::Validator finite_above(double lo, double hi) {
  return finite_range(lo, hi, true);
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string rule = fmt::format("an integer in [{}, {}]", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        if (!parse_integer(text, v)) return fmt::format("'{}' is not an integer: pass {}", text, rule);
        return v >= lo && v <= hi ? std::string() : fmt::format("{} is out of range: pass {}", text, rule);
      },
      rule);
}

CLI::Validator one_of(std::vector<std::string> names) {
  const std::string rule = fmt::format("one of {}", fmt::join(names, ", "));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        for (const auto& n : names)
          if (text == n) return {};
        return fmt::format("'{}' is unknown: pass {}", text, rule);
      },
      rule);
}

std::string choices(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, " | "));
}

void retire_option(CLI::App* cmd, const std::string& old_name, const std::string& new_name,
                   const std::string& why) {
  cmd->add_option_function<std::string>(
         old_name,
         [=](const std::string& value) {
           throw CLI::ValidationError(
               fmt::format("{} {}: {}: pass {} {}", old_name, value, why, new_name, value));
         },
         "")
      ->group("");  // hidden from --help; its own message names the new spelling
}

int threads_per_rank(int threads, int ranks, bool oversubscribe) {
  EXPAR_CHECK(threads >= 0 && threads <= 1024, "--threads {} must be in [0, 1024] (0: cores / ranks)",
              threads);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_rank = threads > 0 ? threads : std::max(1, cores / ranks);
  EXPAR_CHECK(
      oversubscribe || static_cast<int64_t>(ranks) * per_rank <= cores,
      "{} ranks x {} threads = {} exceed the {} cores: lower --threads/--tp/--dp, or pass --oversubscribe",
      ranks, per_rank, static_cast<int64_t>(ranks) * per_rank, cores);
  return per_rank;
}

}  // namespace expar::cli
