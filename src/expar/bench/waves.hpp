#pragma once
// `expar bench waves` (seed 000 §5.9, eq. 10): the real MoE layer (router, route map, a registered path,
// grouped experts) forward and backward under its three expert schedules (moe/waves.hpp): no-wave,
// wave-sequential and wave-overlapped, at each wave count W. Per pass the layer reports its
// dispatch -> experts -> combine section (MoeState::forward_times / backward_times): communication and
// expert seconds and the wall time. T_comm and T_gemm are the wave-sequential figures at the same W (every
// communication step started together with its peers: sync_comm, waits not counted); T~comm and T~gemm
// the same steps while overlapped (T~comm: the communication thread's busy time, including its barrier
// waits for slower peers); T_overlap the overlapped wall time. Eq. 10: overlap pays only if
// T_overlap < T_comm + T_gemm; and to be worth keeping it must also beat no-wave's T_comm + T_gemm.
// Each figure is the median over repeats of the max over ranks. Outputs and input gradients of every
// schedule are compared bit for bit with no-wave.
#include <cstdint>
#include <string>
#include <vector>

#include "expar/bench/layer_bench.hpp"

namespace expar::bench {

// `threads`: compute threads per rank; an overlapped schedule adds one thread per rank.
struct WavesBenchOptions : LayerBenchSetup {
  std::string path = "rowwise";  // a path whose traits say `waves`
  std::vector<int> waves = {2, 4};
};

// Throws expar::Error naming the flag for a bad shape, a path without waves, a wave count outside
// [2, E / ranks], or ranks x threads above the cores without --oversubscribe.
void validate(const WavesBenchOptions& o);

// One pass of one schedule: medians over repeats of the max over ranks.
struct WavePass {
  double comm = 0.0, experts = 0.0, wall = 0.0, wait = 0.0;
};

struct WaveRun {
  int waves = 1;
  bool overlap = false;
  WavePass forward, backward;
  bool identical = false;  // y and grad_x bit-identical to no-wave on every rank
};

struct WavesReport {
  WavesBenchOptions options;
  unsigned cores = 1;
  WaveRun no_wave;
  std::vector<WaveRun> sequential, overlapped;  // one per options.waves entry
};

WavesReport measure_waves(const WavesBenchOptions& o);

std::string format_waves_table(const WavesReport& report);
std::string waves_json(const WavesReport& report);

}  // namespace expar::bench
