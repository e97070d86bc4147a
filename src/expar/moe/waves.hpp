#pragma once
// Wave schedules of the MoE layer (seed 000 §5.9): a microbatch's routed work split into waves so that the
// dispatch of wave i+1 and the combine of wave i-1 can run while the experts compute wave i.
//
// A wave here is a range of LOCAL EXPERTS, the same range on every rank of the EP group: wave w holds the
// routes whose expert is local expert [begin, end) of its rank. With the expert-major layout (contract 3
// of docs/design.md; seed 000 §5.9's four-wave path used an "expert-major static layout" too) a wave's
// rows are one contiguous interval of every rank's expert-side buffer, and each expert's GEMMs see exactly
// the rows and the reduction order of the no-wave step. So the three schedules give bit-identical outputs
// and gradients; what waves change is how many experts share one grouped-GEMM call and what runs beside
// it. (Waves of token chunks would split each expert's GEMM and its weight-gradient sum, changing bits.)
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "expar/moe/route_map.hpp"
#include "expar/topo/placement.hpp"

namespace expar {

enum class WaveSchedule {
  NoWave,      // phase-sequential: dispatch all, experts all, combine all
  Sequential,  // per wave: dispatch, experts, combine (the control that separates smaller GEMMs from overlap)
  Overlapped,  // communication of waves i+1 / i-1 on its own thread beside the experts of wave i
};

const char* wave_schedule_name(WaveSchedule schedule);

// How the layer runs its experts: `waves` 1 is the no-wave schedule; overlap needs waves >= 2.
struct WaveConfig {
  int waves = 1;
  bool overlap = false;
  WaveSchedule schedule() const;
  // Throws expar::Error naming the flag (--waves, --wave-overlap) and the fix: waves in [1, local_experts],
  // overlap only with waves >= 2.
  void validate(int local_experts) const;
  bool operator==(const WaveConfig&) const = default;
};

// Local experts [begin, end) of every rank.
struct ExpertWave {
  int begin = 0, end = 0;
};

// `waves` consecutive, nearly equal ranges covering [0, local_experts) (the first ones one expert larger
// when it does not divide). Throws unless 1 <= waves <= local_experts.
std::vector<ExpertWave> split_expert_waves(int local_experts, int waves);

// Where each wave's rows are, from one source rank's route map: the wave of every route and the expert-side
// row interval of every wave on every rank (identical on every rank of the group, from the accepted matrix).
struct WaveRoutes {
  int waves = 1;
  std::vector<int32_t> wave_of;  // [T*K]: the wave of route t*K + k, -1 for a dropped or invalid route
  std::vector<int64_t> bounds;   // [M x (waves + 1)]: rank r's wave w holds rows [bound(r, w), bound(r, w+1))
  int64_t row_begin(int rank, int wave) const {
    return bounds[static_cast<size_t>(rank * (waves + 1) + wave)];
  }
  int64_t row_end(int rank, int wave) const { return row_begin(rank, wave + 1); }
};

// `waves` empty: one wave of every expert.
WaveRoutes make_wave_routes(const RouteMap& map, const ExpertPlacement& placement,
                            std::span<const ExpertWave> waves);

}  // namespace expar
