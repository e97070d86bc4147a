// expar: the command-line entry point. Each subcommand lives in its own file (cli/<name>.cpp) and registers
// itself through cli/commands.hpp.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "expar/cli/commands.hpp"
#include "expar/core/error.hpp"

namespace {

// The last words of a failed command: a stderr that cannot be written (fmt::print throws) must still end
// with status 1, not an abort out of a catch handler.
template <typename... Args>
void print_error(fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    fmt::print(stderr, format, std::forward<Args>(args)...);
  } catch (...) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"expar: an expert-parallel Mixture-of-Experts runtime"};
  app.require_subcommand(1);
  expar::cli::register_commands(app);
  try {
    // CLI11 would print the top-level help with status 0 for `expar nosuchcommand --help`.
    if (argc > 1 && argv[1][0] != '-') {
      std::string names;
      bool known = false;
      for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        known = known || sub->check_name(argv[1]);
        names += (names.empty() ? "" : ", ") + sub->get_name();
      }
      if (!known) expar::fail("unknown command '{}': the commands are {}", argv[1], names);
    }
    app.parse(argc, argv);
    return expar::cli::run_selected(app);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // An unknown subcommand, a bad value, a missing argument: status 1 with the flag, value and rule.
    print_error("expar: error: {}\nRun 'expar --help' or 'expar <command> --help' for the options.\n",
                e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    print_error(
        "expar: error: out of memory: the model, batch or ranks asked for more memory than this machine "
        "gives; use a smaller --batch, --seq-len, --ranks or model\n");
    return 1;
  } catch (const std::length_error& e) {
    print_error(
        "expar: error: a size computed from the options is too large ({}): use smaller --batch, "
        "--seq-len, --tokens or model dimensions\n",
        e.what());
    return 1;
  } catch (const std::exception& e) {
    print_error("expar: error: {}\n", e.what());
    return 1;
  }
}
