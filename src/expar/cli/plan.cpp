// `expar plan`: placeholder until the plan helper lands (topo/ + cli/plan.cpp).
#include <cstdio>

#include "expar/cli/commands.hpp"

namespace expar::cli {

void add_plan(CLI::App& app, CommandTable& table) {
  auto* cmd = app.add_subcommand("plan", "Per-rank memory and communication volume for a model and layout");
  table[cmd] = [] {
    std::puts("expar plan: not built yet");
    return 0;
  };
}

}  // namespace expar::cli
