#pragma once
// `--json FILE`, one meaning in every subcommand: also write the results as JSON to FILE; `--json -` prints
// the JSON on stdout in place of the table (stdout then parses as one JSON document). A bare `--json`, the
// old flag of `plan` and `tokenize`, means `--json -` for one release.
#include <CLI/CLI.hpp>
#include <string>

namespace expar::cli {

struct JsonOutput {
  std::string path;  // empty: no JSON; "-": stdout

  bool wanted() const { return !path.empty(); }
  // False with `--json -`: the human-readable table would break the JSON on stdout.
  bool table_wanted() const { return path != "-"; }
  // `text` to the file, or to stdout; does nothing when no --json was given.
  void write(const std::string& text) const;
};

// `what` names the results in --help ("the figures", "the plan", ...).
void add_json_option(CLI::App* cmd, JsonOutput& out, const std::string& what);

}  // namespace expar::cli
