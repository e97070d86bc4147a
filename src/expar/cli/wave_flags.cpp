#include "expar/cli/wave_flags.hpp"

#include "expar/cli/option_checks.hpp"

namespace expar::cli {

void add_wave_flags(CLI::App* cmd, WaveConfig& waves) {
  cmd->add_option("--waves", waves.waves,
                  "split each MoE layer's experts into N waves of local experts (1: no waves; block, rowwise "
                  "and aggregated; at most E / M_E); results are bit-identical to no waves")
      ->capture_default_str()
      ->check(integer_in(1, 4096));
  cmd->add_flag("--wave-overlap", waves.overlap,
                "run the communication of waves i+1 / i-1 on its own thread beside the experts of wave i "
                "(needs --waves 2 or more; the thread competes with compute for the cores)");
}

}  // namespace expar::cli
