#include "expar/cli/commands.hpp"

namespace expar::cli {

// One line per subcommand (each defined in its own file).
void add_plan(CLI::App& app, CommandTable& table);
void add_layer(CLI::App& app, CommandTable& table);
void add_bench(CLI::App&, CommandTable&);
void add_train(CLI::App& app, CommandTable& table);
void add_generate(CLI::App& app, CommandTable& table);
void add_eval(CLI::App& app, CommandTable& table);
void add_serve(CLI::App& app, CommandTable& table);
void add_tokenize(CLI::App& app, CommandTable& table);

namespace {
CommandTable& table() {
  static CommandTable t;
  return t;
}
}  // namespace

void register_commands(CLI::App& app) {
  add_plan(app, table());
  add_layer(app, table());
  add_bench(app, table());
  add_train(app, table());
  add_generate(app, table());
  add_eval(app, table());
  add_serve(app, table());
  add_tokenize(app, table());
}

int run_selected(CLI::App& app) {
  for (auto& [sub, fn] : table())
    if (sub->parsed()) return fn();
  return 1;
}

}  // namespace expar::cli
