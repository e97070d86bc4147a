#include "expar/moe/moe_layer.hpp"

#include <chrono>
#include <cmath>

#include "expar/comm/comm.hpp"
#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/moe/phase_timer.hpp"

namespace expar {

namespace {

ExpertWeights make_experts(const MoeConfig& c, int64_t e_local, MemCategory category) {
  const int64_t d = c.model_dim, h = c.hidden_dim;
  auto make = [&](Shape s) { return Tensor::zeros(std::move(s), DType::F32, category); };
  ExpertWeights w;
  w.w1 = make({e_local, h, d});
  w.w3 = make({e_local, h, d});
  w.w2 = make({e_local, d, h});
  if (c.expert_biases) {
    w.b1 = make({e_local, h});
    w.b3 = make({e_local, h});
    w.b2 = make({e_local, d});
  }
  w.activation = c.activation;
  return w;
}

}  // namespace

MoeLayer::MoeLayer(MoeConfig config, MoeExecution execution, Comm& ep_group, std::string name,
                   MoeSharedResources shared)
    : config_(std::move(config)),
      execution_(std::move(execution)),
      ep_group_(ep_group),
      name_(std::move(name)),
      placement_((config_.validate(), execution_.validate(config_, ep_group.size()),
                  execution_.expert_placement(config_.router.num_experts, ep_group.size()))) {
  PathOptions options;
  options.model_dim = config_.model_dim;
  options.top_k = config_.router.top_k;
  options.placement = &placement_;
  options.heap = shared.heap;
  options.lease_pool = shared.lease_pool;
  options.block_index = shared.block_index;
  options.precision = execution_.precision;
  path_ = make_path(execution_.path, ep_group_, options);
  const int64_t e_local = placement_.local_count(), d = config_.model_dim, e = config_.router.num_experts;
  params_.w_router = Tensor::zeros({e, d}, DType::F32, MemCategory::DenseWeights);
  if (config_.use_score_bias) params_.score_bias = Tensor::zeros({e}, DType::F32, MemCategory::DenseWeights);
  if (config_.router_bias) {
    params_.router_bias = Tensor::zeros({e}, DType::F32, MemCategory::DenseWeights);
    grads_.router_bias = Tensor::zeros({e}, DType::F32, MemCategory::Gradients);
  }
  params_.experts = make_experts(config_, e_local, MemCategory::ExpertWeights);
  grads_.w_router = Tensor::zeros({e, d}, DType::F32, MemCategory::Gradients);
  grads_.experts = make_experts(config_, e_local, MemCategory::Gradients);
}

MoeLayer::~MoeLayer() = default;

int MoeLayer::ep_rank() const {
  return ep_group_.rank();
}

void init_router_weight(Tensor& w_router, const std::string& name, uint64_t seed) {
  fill_normal(w_router, seed, stream_of((name + ".router").c_str()),
              1.0f / std::sqrt(static_cast<float>(w_router.dim(1))));
}

void init_moe_params(MoeParams& params, const MoeConfig& config, const ExpertPlacement& placement,
                     int ep_rank, const std::string& name, uint64_t seed) {
  const int64_t d = config.model_dim, h = config.hidden_dim;
  EXPAR_CHECK(params.experts.local_count() == placement.local_count(),
              "init of '{}': {} local expert slots for a placement with {} local slots", name,
              params.experts.local_count(), placement.local_count());
  init_router_weight(params.w_router, name, seed);
  for (Tensor* bias :
       {&params.score_bias, &params.router_bias, &params.experts.b1, &params.experts.b3, &params.experts.b2})
    if (bias->defined()) bias->zero();
  for (int l = 0; l < placement.local_count(); ++l) {
    const int e = placement.global_expert(ep_rank, l);
    auto fill = [&](Tensor& all, const char* which, int64_t rows, int64_t cols, int64_t fan_in) {
      Tensor one = all.rows(l, l + 1).reshape({rows, cols});
      const std::string stream = fmt::format("{}.experts.{}.{}", name, e, which);
      fill_normal(one, seed, stream_of(stream.c_str()), 1.0f / std::sqrt(static_cast<float>(fan_in)));
    };
    fill(params.experts.w1, "w1", h, d, d);
    fill(params.experts.w3, "w3", h, d, d);
    fill(params.experts.w2, "w2", d, h, h);
  }
}

void MoeLayer::init_params(uint64_t seed) {
  init_moe_params(params_, config_, placement_, ep_group_.rank(), name_, seed);
}

void MoeLayer::zero_grads() {
  grads_.w_router.zero();
  grads_.experts.w1.zero();
  grads_.experts.w3.zero();
  grads_.experts.w2.zero();
  for (Tensor* bias : {&grads_.router_bias, &grads_.experts.b1, &grads_.experts.b3, &grads_.experts.b2})
    if (bias->defined()) bias->zero();
  expert_grads_zero_ = true;
}

Tensor MoeLayer::forward(const Tensor& x, MoeState& state) {
  EXPAR_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && x.dim(1) == config_.model_dim,
              "MoE layer '{}' input must be f32 [T, {}], got {} {}", name_, config_.model_dim,
              dtype_name(x.dtype()), shape_string(x.shape()));
  const Tensor y = moe_forward(config_, placement_, weights(), x, forward_options(), state);
  state.recomputed = recompute_;
  if (recompute_) {
    // Backward rebuilds these; dropping them now frees the expert activations and the gathered expert
    // outputs (and, for rowwise, the reference to the dispatch scratch payload, which the next block's
    // dispatch overwrites).
    state.path = {};
    state.experts = {};
    state.expert_waves.clear();
  }
  return y;
}

MoeWeights MoeLayer::weights() const {
  MoeWeights w;
  w.w_router = &params_.w_router;
  w.score_bias = params_.score_bias.defined() && config_.use_score_bias ? &params_.score_bias : nullptr;
  w.router_bias = params_.router_bias.defined() ? &params_.router_bias : nullptr;
  w.experts = &params_.experts;
  return w;
}

MoeForwardOptions MoeLayer::forward_options() const {
  MoeForwardOptions o;
  o.path = path_.get();
  o.sources = &ep_group_;
  o.capacity = execution_.capacity;
  o.dispatch_format = execution_.precision.dispatch;
  o.loss_scope = loss_scope_;
  o.waves = execution_.waves;
  o.scratch_dispatch = recompute_;
  o.microbatch = microbatch_;
  // No replica deal: every step deals a replicated expert's routes from its first replica. A training batch
  // sends many routes to each hot expert, which split within 1 over its replicas anyway, and the routes stay
  // a function of the step's batch alone, so a resumed run routes as the uninterrupted one did.
  o.replica_deal = nullptr;
  return o;
}

Tensor MoeLayer::backward(const Tensor& grad_y, MoeState& state) {
  EXPAR_CHECK(grad_y.dtype() == DType::F32 && grad_y.ndim() == 2 && grad_y.dim(0) == state.routes.tokens &&
                  grad_y.dim(1) == config_.model_dim,
              "MoE layer '{}' backward: grad_y must be f32 [{}, {}], got {}", name_, state.routes.tokens,
              config_.model_dim, shape_string(grad_y.shape()));
  if (state.recomputed) recompute_forward(state);
  Tensor grad_topk_weight;
  Tensor grad_x = experts_backward(grad_y, state, grad_topk_weight);
  PhaseScope router_phase(phase::kRouter);
  router_backward(config_.router, state.router, params_.w_router, grad_topk_weight, grad_x, grads_.w_router,
                  grads_.router_bias.defined() ? &grads_.router_bias : nullptr);
  router_phase.stop();
  return grad_x;
}

void MoeLayer::recompute_forward(MoeState& state) {
  EXPAR_CHECK(state.router.x.defined() && state.router.topk_weight.defined(),
              "MoE layer '{}' backward: the recomputing forward's router state is gone (was the state moved "
              "or reset?): keep the MoeState of a forward until its backward",
              name_);
  // The original forward's dispatch, experts and combine gather again, from the saved input and route map
  // (no router, no route-map collective). The payload may be scratch again: see rowwise.cpp for why no
  // other block can overwrite it before this block's expert backward has read it.
  const MoeForwardOptions o = forward_options();
  state.path = {};
  state.path.scratch_dispatch = true;
  state.path.microbatch = state.microbatch;
  // Only for the gathered expert outputs it saves (the routing-weight gradient reads them); its merged
  // output equals the forward's y and is dropped. The recomputation runs the forward's schedule.
  const WaveTimes forward_times = state.forward_times;
  moe_experts_forward(*path_, params_.experts, state.router.x, state.router.topk_weight, o, state);
  state.forward_times = forward_times;
}

Tensor MoeLayer::experts_backward(const Tensor& grad_y, MoeState& state, Tensor& grad_topk_weight) {
  const RouteMap& map = state.routes;
  PathState& ps = state.path;
  const Tensor& topk_weight = state.router.topk_weight;
  const int64_t d = config_.model_dim;
  const WaveSchedule schedule = state.waves.schedule();
  Tensor grad_out, grad_in, grad_x;
  // Each local expert's weight gradients are written by one expert backward (its wave's, if any), so after
  // zero_grads the whole backward may write them; cleared first, so that a backward that throws midway
  // leaves the next one adding.
  const GradientUpdate update = expert_grads_zero_ ? GradientUpdate::IntoZeros : GradientUpdate::Add;
  expert_grads_zero_ = false;
  auto gemm = [&](auto&& fn) {
    PhaseScope gemm_phase(phase::kGroupedGemm);
    fn();
  };
  if (schedule == WaveSchedule::NoWave) {
    state.backward_times = run_wave_schedule(
        schedule, 1,
        [&](int) {
          grad_out = path_->combine_backward(grad_y, topk_weight, map, ps, grad_topk_weight);
          grad_in = path_->expert_grad_input_buffer(map, d, ps);
        },
        [&](int) {
          gemm([&] {
            expert_mlp_backward(grad_out, state.experts, params_.experts, grad_in, grads_.experts, update);
          });
        },
        [&](int) { grad_x = path_->dispatch_backward(grad_in, map, ps); });
    return grad_x;
  }
  const int n = static_cast<int>(ps.waves.size());
  EXPAR_CHECK(n >= 1 && state.expert_waves.size() == static_cast<size_t>(n),
              "MoE layer '{}' backward: the forward ran {} waves with {} expert states (was the schedule "
              "changed between forward and backward?)",
              name_, n, state.expert_waves.size());
  const auto started = std::chrono::steady_clock::now();
  grad_out = path_->combine_backward_begin(grad_y, topk_weight, map, ps, grad_topk_weight);
  grad_in = path_->expert_grad_input_buffer(map, d, ps);
  const double set_up = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  WaveTimes t = run_wave_schedule(
      schedule, n, [&](int w) { path_->combine_backward_wave(grad_y, topk_weight, map, ps, w); },
      [&](int w) {
        const ExpertWave wave = ps.waves[static_cast<size_t>(w)];
        const ExpertWaveRows rows = expert_wave_rows(map, wave);
        if (rows.row_end == rows.row_begin) return;
        Tensor in = grad_in.rows(rows.row_begin, rows.row_end);
        ExpertWeights wave_grads = grads_.experts.experts(wave.begin, wave.end);
        gemm([&] {
          expert_mlp_backward(grad_out.rows(rows.row_begin, rows.row_end),
                              state.expert_waves[static_cast<size_t>(w)],
                              params_.experts.experts(wave.begin, wave.end), in, wave_grads, update);
        });
      },
      [&](int w) { path_->dispatch_backward_wave(grad_in, map, ps, w); });
  const auto summing = std::chrono::steady_clock::now();
  grad_x = path_->dispatch_backward_end(map, ps);
  const double sum = std::chrono::duration<double>(std::chrono::steady_clock::now() - summing).count();
  t.comm += set_up + sum;
  t.wall += set_up + sum;
  state.backward_times = t;
  return grad_x;
}

void MoeLayer::set_waves(WaveConfig waves) {
  MoeExecution check = execution_;
  check.waves = waves;
  check.validate(config_, ep_group_.size());
  execution_.waves = waves;
}

void MoeLayer::set_placement(const ExpertPlacement& next) {
  EXPAR_CHECK(next.ep_size() == placement_.ep_size() && next.num_experts() == placement_.num_experts() &&
                  next.num_slots() == placement_.num_slots(),
              "{}: a new placement must keep {} experts in {} slots over {} ranks, got {} in {} over {}",
              name_, placement_.num_experts(), placement_.num_slots(), placement_.ep_size(),
              next.num_experts(), next.num_slots(), next.ep_size());
  std::vector<int> slots;
  for (int s = 0; s < next.num_slots(); ++s) slots.push_back(next.slot_expert(s));
  placement_ = next;  // the path reads it through its pointer at every step
  execution_.slots = std::move(slots);
}

}  // namespace expar
