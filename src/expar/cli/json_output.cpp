#include "expar/cli/json_output.hpp"

#include <fmt/format.h>

#include "expar/bench/measure.hpp"

namespace expar::cli {

void JsonOutput::write(const std::string& text) const {
  if (!wanted()) return;
  if (path != "-") return bench::write_text_file(path, text);
  const bool newline = text.empty() || text.back() != '\n';
  fmt::print("{}{}", text, newline ? "\n" : "");
}

void add_json_option(CLI::App* cmd, JsonOutput& out, const std::string& what) {
  // expected(0, 1) with "-" as the value of a bare --json keeps the old flag spelling working.
  cmd->add_option("--json", out.path,
                  fmt::format("also write {} as JSON to FILE ('-': print the JSON on stdout in place of the "
                              "table; a bare --json, the old flag, means '-' for one release)",
                              what))
      ->expected(0, 1)
      ->default_str("-")
      ->option_text("FILE");
}

}  // namespace expar::cli
