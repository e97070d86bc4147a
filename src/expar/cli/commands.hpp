#pragma once
// Subcommand registry. A subcommand file defines `void add_<name>(CLI::App&, CommandTable&)` and is listed
// once in commands.cpp.
#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>

namespace expar::cli {

using CommandTable = std::map<CLI::App*, std::function<int()>>;

void register_commands(CLI::App& app);
int run_selected(CLI::App& app);

}  // namespace expar::cli
