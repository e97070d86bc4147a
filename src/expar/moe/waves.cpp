#include "expar/moe/waves.hpp"

#include <algorithm>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"

namespace expar {

const char* wave_schedule_name(WaveSchedule schedule) {
  switch (schedule) {
    case WaveSchedule::NoWave:
      return "no-wave";
    case WaveSchedule::Sequential:
      return "wave-sequential";
    case WaveSchedule::Overlapped:
      return "wave-overlapped";
  }
  return "?";
}

WaveSchedule WaveConfig::schedule() const {
  if (waves <= 1) return WaveSchedule::NoWave;
  return overlap ? WaveSchedule::Overlapped : WaveSchedule::Sequential;
}

void WaveConfig::validate(int local_experts) const {
  EXPAR_CHECK(waves >= 1 && waves <= std::max(1, local_experts),
              "--waves {} must be in [1, {}]: a wave is a range of local experts and each rank has {} (E / "
              "M_E); pass --waves {} or less",
              waves, std::max(1, local_experts), local_experts, std::max(1, local_experts));
  EXPAR_CHECK(!overlap || waves >= 2,
              "--wave-overlap needs --waves 2 or more: with one wave there is nothing to run beside the "
              "experts");
}

std::vector<ExpertWave> split_expert_waves(int local_experts, int waves) {
  EXPAR_ASSERT(waves >= 1 && waves <= local_experts,
               "{} waves over {} local experts: each wave needs at least one expert (waves in [1, {}])",
               waves, local_experts, local_experts);
  std::vector<ExpertWave> out;
  int begin = 0;
  for (int w = 0; w < waves; ++w) {
    const int size = local_experts / waves + (w < local_experts % waves ? 1 : 0);
    out.push_back({begin, begin + size});
    begin += size;
  }
  return out;
}

WaveRoutes make_wave_routes(const RouteMap& map, const ExpertPlacement& placement,
                            std::span<const ExpertWave> waves) {
  const int e_local = placement.local_count();
  const ExpertWave all[] = {{0, e_local}};
  if (waves.empty()) waves = all;
  WaveRoutes wr;
  wr.waves = static_cast<int>(waves.size());
  EXPAR_ASSERT(waves.front().begin == 0 && waves.back().end == e_local,
               "waves cover local experts [{}, {}) but the placement has {}", waves.front().begin,
               waves.back().end, e_local);
  const int m = map.ep_size;
  wr.bounds.assign(static_cast<size_t>(m * (wr.waves + 1)), 0);
  // Rank r's expert-side rows: local experts in order, each holding every source's accepted routes.
  for (int r = 0; r < m; ++r) {
    int64_t offset = 0;
    int w = 0;
    for (int l = 0; l < e_local; ++l) {
      if (l == waves[static_cast<size_t>(w)].end) ++w;
      if (l == waves[static_cast<size_t>(w)].begin)
        wr.bounds[static_cast<size_t>(r * (wr.waves + 1) + w)] = offset;
      const int e = placement.slot(r, l);
      for (int s = 0; s < m; ++s) offset += map.accepted_of(s, e);
    }
    wr.bounds[static_cast<size_t>(r * (wr.waves + 1) + wr.waves)] = offset;
  }
  wr.wave_of.assign(static_cast<size_t>(map.tokens * map.top_k), -1);
  for (int64_t t = 0; t < map.tokens; ++t)
    for (int k = 0; k < map.top_k; ++k) {
      if (!map.valid(t, k)) continue;
      const int r = map.rank_of(t, k);
      const int64_t row = map.row_of(t, k);
      const auto* b = wr.bounds.data() + r * (wr.waves + 1);
      // The last wave whose first row is at or before `row` (empty waves share their bound with the next).
      const auto it = std::upper_bound(b, b + wr.waves, row);
      wr.wave_of[static_cast<size_t>(t * map.top_k + k)] = static_cast<int32_t>(it - b - 1);
    }
  return wr;
}

}  // namespace expar
