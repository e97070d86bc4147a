// expar: the command-line entry point. Each subcommand lives in its own file (cli/<name>.cpp) and registers
// itself through cli/commands.hpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"expar: an expert-parallel Mixture-of-Experts runtime"};
  app.require_subcommand(1);
  expar::cli::register_commands(app);
  try {
    app.parse(argc, argv);
    return expar::cli::run_selected(app);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expar: error: %s\n", e.what());
    return 1;
  }
}
