#pragma once
// The wave-schedule flags shared by `expar train` and `expar layer` (moe/waves.hpp): --waves N and
// --wave-overlap.
#include <CLI/CLI.hpp>

#include "expar/moe/waves.hpp"

namespace expar::cli {

void add_wave_flags(CLI::App* cmd, WaveConfig& waves);

}  // namespace expar::cli
