#pragma once
// Range checks for command-line options, attached to CLI11 options with ->check(...). A value outside the
// rule fails parsing with "<flag>: <value> is ...: <rule>; <fix>" (main() prints it as an error, status 1).
// Floats must be finite (CLI11's own Range lets NaN through); integers must fit their range (products of
// options are checked where they are used).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace expar::cli {

// A finite number in [lo, hi].
CLI::Validator finite_in(double lo, double hi);
// A finite number in (lo, hi].
CLI::Validator finite_above(double lo, double hi);
// An integer in [lo, hi].
CLI::Validator integer_in(int64_t lo, int64_t hi);
// One of `names` (the message lists them). Lists of choices come from their registries (path_names(),
// model_format_names(), ...), never typed again here.
CLI::Validator one_of(std::vector<std::string> names);
// "a | b | c": the choices of `names` for a help line.
std::string choices(const std::vector<std::string>& names);

// An old spelling that is no longer accepted, hidden from --help: `old_name VALUE` fails with
// "old_name VALUE: <why>: pass new_name VALUE", a suggestion that runs as printed. One flag means one thing
// in every subcommand, so an old name is refused rather than kept as a second name.
void retire_option(CLI::App* cmd, const std::string& old_name, const std::string& new_name,
                   const std::string& why);

// Compute threads per rank for `--threads` (0: cores / ranks, at least 1). Throws expar::Error when
// threads is outside [0, 1024] or ranks x threads exceed the cores without `--oversubscribe`.
int threads_per_rank(int threads, int ranks, bool oversubscribe);

}  // namespace expar::cli
