#include "expar/moe/moe_forward.hpp"

#include <chrono>

#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

ExpertWaveRows expert_wave_rows(const RouteMap& map, ExpertWave wave) {
  ExpertWaveRows w;
  w.row_begin = map.expert_offsets[static_cast<size_t>(wave.begin)];
  w.row_end = map.expert_offsets[static_cast<size_t>(wave.end)];
  for (int l = wave.begin; l <= wave.end; ++l)
    w.offsets.push_back(map.expert_offsets[static_cast<size_t>(l)] - w.row_begin);
  return w;
}

Tensor moe_forward(const MoeConfig& config, const ExpertPlacement& placement, const MoeWeights& weights,
                   const Tensor& x, const MoeForwardOptions& options, MoeState& state) {
  EXPAR_ASSERT(options.path != nullptr && weights.w_router != nullptr && weights.experts != nullptr,
               "moe_forward needs a path, the router weight and the experts");
  PhaseScope router_phase(phase::kRouter);
  RouterOutput routed = router_forward(config.router, x, *weights.w_router, weights.score_bias, state.router,
                                       weights.router_bias, options.loss_scope);
  router_phase.stop();
  PhaseScope route_map_phase(phase::kRouteMap);
  const std::span<const int64_t> starts =
      options.replica_deal != nullptr ? options.replica_deal->starts() : std::span<const int64_t>{};
  if (options.sources != nullptr)
    state.routes = build_route_map(routed.topk_idx, *options.sources, placement, options.capacity,
                                   options.partition, starts);
  else
    state.routes = build_route_map(
        routed.topk_idx, 0, count_requests(routed.topk_idx, config.router.num_experts),
        std::vector<int64_t>{x.dim(0)}, placement, options.capacity, options.partition, starts);
  if (options.replica_deal != nullptr) options.replica_deal->advance(state.routes, placement);
  route_map_phase.stop();
  state.path = {};
  state.path.scratch_dispatch = options.scratch_dispatch;
  state.path.microbatch = options.microbatch;
  state.microbatch = options.microbatch;
  state.waves = options.waves;
  Tensor y = moe_experts_forward(*options.path, *weights.experts, x, routed.topk_weight, options, state);

  MoeMetrics& m = state.metrics;
  m.aux_loss = routed.aux_loss;
  m.z_loss = routed.z_loss;
  m.drop_rate = state.routes.group_drop_rate();
  m.utilisation = state.routes.max_utilisation();
  m.dropped = state.routes.dropped;
  m.routes = x.dim(0) * config.router.top_k;
  m.expert_counts = std::move(routed.expert_counts);
  return y;
}

Tensor moe_experts_forward(ExpertPath& path, const ExpertWeights& experts, const Tensor& x,
                           const Tensor& topk_weight, const MoeForwardOptions& options, MoeState& state) {
  const RouteMap& map = state.routes;
  PathState& ps = state.path;
  const int64_t d = x.dim(1);
  const WaveSchedule schedule = state.waves.schedule();
  Tensor expert_in, expert_out, y;
  auto gemm = [&](auto&& fn) {
    PhaseScope gemm_phase(phase::kGroupedGemm);
    fn();
  };
  if (schedule == WaveSchedule::NoWave) {
    state.forward_times = run_wave_schedule(
        schedule, 1,
        [&](int) {
          // agrs moves the router weights with the rows it gathers (read by dispatch only).
          ps.agrs.topk_weight = &topk_weight;
          expert_in = path.dispatch_forward(x, map, ps);
          ps.agrs.topk_weight = nullptr;
          expert_out = path.expert_output_buffer(map, d, ps);
        },
        [&](int) {
          gemm([&] {
            expert_mlp_forward(expert_in, options.dispatch_format, map.expert_offsets, experts, expert_out,
                               options.keep_activations ? &state.experts : nullptr);
          });
        },
        [&](int) {
          if (options.before_combine) options.before_combine(map, ps);
          y = path.combine_forward(expert_out, topk_weight, map, ps);
        });
    return y;
  }
  EXPAR_ASSERT(!options.before_combine, "a combine addend needs the no-wave schedule");
  const auto started = std::chrono::steady_clock::now();
  ps.waves = split_expert_waves(static_cast<int>(experts.local_count()), state.waves.waves);
  const int n = static_cast<int>(ps.waves.size());
  expert_in = path.dispatch_forward_begin(x, map, ps);
  expert_out = path.expert_output_buffer(map, d, ps);
  state.expert_waves.assign(options.keep_activations ? static_cast<size_t>(n) : 0, ExpertMlpState{});
  const double set_up = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  WaveTimes t = run_wave_schedule(
      schedule, n, [&](int w) { path.dispatch_forward_wave(x, map, ps, w); },
      [&](int w) {
        const ExpertWave wave = ps.waves[static_cast<size_t>(w)];
        const ExpertWaveRows rows = expert_wave_rows(map, wave);
        if (rows.row_end == rows.row_begin) return;  // no rows: its state stays empty and backward skips it
        Tensor out = expert_out.rows(rows.row_begin, rows.row_end);
        gemm([&] {
          expert_mlp_forward(
              expert_in.rows(rows.row_begin, rows.row_end), options.dispatch_format, rows.offsets,
              experts.experts(wave.begin, wave.end), out,
              options.keep_activations ? &state.expert_waves[static_cast<size_t>(w)] : nullptr);
        });
      },
      [&](int w) { path.combine_forward_wave(expert_out, map, ps, w); });
  const auto merging = std::chrono::steady_clock::now();
  y = path.combine_forward_end(topk_weight, map, ps);
  const double merge = std::chrono::duration<double>(std::chrono::steady_clock::now() - merging).count();
  t.comm += set_up + merge;
  t.wall += set_up + merge;
  state.forward_times = t;
  return y;
}

}  // namespace expar
