#include "expar/model/layer_tool.hpp"

#include <cstring>
#include <mutex>
#include <vector>

#include "expar/comm/comm.hpp"
#include "expar/comm/launcher.hpp"
#include "expar/core/error.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/moe/moe_layer.hpp"
#include "expar/topo/training_layout.hpp"

namespace expar {

namespace {

const Tensor& need(const std::map<std::string, Tensor>& inputs, const std::string& name, DType dtype,
                   const Shape& shape) {
  auto it = inputs.find(name);
  EXPAR_CHECK(it != inputs.end(),
              "expar layer: the input has no tensor '{}' (expected {} {}): see `expar layer --help` for the "
              "tensor names",
              name, dtype_name(dtype), shape_string(shape));
  EXPAR_CHECK(it->second.dtype() == dtype && it->second.shape() == shape,
              "expar layer: tensor '{}' is {} {} but must be {} {}: convert it before writing the input",
              name, dtype_name(it->second.dtype()), shape_string(it->second.shape()), dtype_name(dtype),
              shape_string(shape));
  return it->second;
}

std::string expert_name(int e, const char* w) {
  return "experts." + std::to_string(e) + "." + w + ".weight";
}

// What one rank hands back to the assembling thread.
struct RankOutput {
  Tensor y, grad_x, topk_idx, topk_weight, dst_row, grad_router;
  ExpertWeights grad_experts;
  std::vector<int> experts;  // global ids of its local experts
  int64_t dropped = 0;
  double utilisation = 0.0;
};

void copy_rows(Tensor& dst, int64_t at, const Tensor& src) {
  if (src.numel() == 0) return;
  const size_t row_bytes = src.nbytes() / static_cast<size_t>(src.dim(0));
  std::memcpy(static_cast<std::byte*>(dst.raw()) + static_cast<size_t>(at) * row_bytes, src.raw(),
              src.nbytes());
}

// The input tensors, checked: shapes agree with x [N, d], gate.weight [E, d] and expert 0's w1 [h, d].
struct LayerInputs {
  const Tensor* x = nullptr;
  const Tensor* gate = nullptr;
  int64_t n = 0, d = 0, h = 0;
  int e_count = 0;
  std::vector<int64_t> tokens;  // per rank
  Tensor grad_y;
};

// tokens_per_rank when given (each >= 0, summing to N), else N split evenly over the ranks.
std::vector<int64_t> tokens_per_rank(const std::map<std::string, Tensor>& inputs, int ranks, int64_t n) {
  std::vector<int64_t> tokens(static_cast<size_t>(ranks));
  if (auto it = inputs.find("tokens_per_rank"); it != inputs.end()) {
    const Tensor& t = need(inputs, "tokens_per_rank", DType::I64, {ranks});
    int64_t sum = 0;
    for (int r = 0; r < ranks; ++r) {
      tokens[static_cast<size_t>(r)] = t.data<int64_t>()[r];
      EXPAR_CHECK(tokens[static_cast<size_t>(r)] >= 0, "expar layer: tokens_per_rank[{}] = {} is negative", r,
                  tokens[static_cast<size_t>(r)]);
      sum += tokens[static_cast<size_t>(r)];
    }
    EXPAR_CHECK(sum == n, "expar layer: tokens_per_rank sums to {} but x has {} rows: they must agree", sum,
                n);
  } else {
    EXPAR_CHECK(
        n % ranks == 0,
        "expar layer: x has {} rows, not divisible by --ranks {}: add an I64 'tokens_per_rank' tensor "
        "for uneven token counts",
        n, ranks);
    for (auto& t : tokens) t = n / ranks;
  }
  return tokens;
}

LayerInputs read_layer_inputs(const std::map<std::string, Tensor>& inputs, const LayerToolOptions& options) {
  LayerInputs in;
  auto x_it = inputs.find("x");
  EXPAR_CHECK(x_it != inputs.end() && x_it->second.dtype() == DType::F32 && x_it->second.ndim() == 2,
              "expar layer: the input needs 'x', f32 [N, d] (all ranks' tokens stacked rank-major)");
  in.x = &x_it->second;
  in.n = in.x->dim(0);
  in.d = in.x->dim(1);
  auto gate_it = inputs.find("gate.weight");
  EXPAR_CHECK(gate_it != inputs.end() && gate_it->second.ndim() == 2,
              "expar layer: the input needs 'gate.weight', f32 [E, d] (the router)");
  in.e_count = static_cast<int>(gate_it->second.dim(0));
  in.gate = &need(inputs, "gate.weight", DType::F32, {in.e_count, in.d});
  auto w1_it = inputs.find(expert_name(0, "w1"));
  EXPAR_CHECK(w1_it != inputs.end() && w1_it->second.ndim() == 2,
              "expar layer: the input needs '{}', f32 [h, d] (expert 0's gate projection)",
              expert_name(0, "w1"));
  in.h = w1_it->second.dim(0);
  for (int e = 0; e < in.e_count; ++e) {
    need(inputs, expert_name(e, "w1"), DType::F32, {in.h, in.d});
    need(inputs, expert_name(e, "w3"), DType::F32, {in.h, in.d});
    need(inputs, expert_name(e, "w2"), DType::F32, {in.d, in.h});
  }
  EXPAR_CHECK(options.ranks >= 1, "expar layer: --ranks {} must be at least 1", options.ranks);
  in.tokens = tokens_per_rank(inputs, options.ranks, in.n);
  if (inputs.count("grad_y")) {
    in.grad_y = need(inputs, "grad_y", DType::F32, {in.n, in.d});
  } else {
    in.grad_y = Tensor::empty({in.n, in.d});
    in.grad_y.fill(1.0f);
  }
  return in;
}

// The layer the options describe, at the inputs' shape.
MoeConfig layer_config(const LayerToolOptions& options, const LayerInputs& in) {
  MoeConfig config;
  config.router.num_experts = in.e_count;
  config.router.top_k = options.top_k;
  config.model_dim = in.d;
  config.hidden_dim = in.h;
  config.router.score = score_function_from_name(options.score);
  config.router.renormalize = options.renormalize;
  return config;
}

// How the options run it.
MoeExecution layer_execution(const LayerToolOptions& options) {
  MoeExecution execution;
  execution.path = options.path;
  execution.precision = options.precision;
  execution.waves = options.waves;
  if (options.capacity_factor > 0.0)
    execution.capacity =
        CapacityPolicy::with(capacity_rule_from_name(options.capacity_policy), options.capacity_factor);
  else
    EXPAR_CHECK(options.capacity_factor == 0.0,
                "expar layer: --capacity-factor {} must be > 0 (or 0 for dropless)", options.capacity_factor);
  return execution;
}

// The router and this rank's local experts' weights from the inputs (expert-major rows).
void load_weights(MoeLayer& layer, const LayerInputs& in, const std::map<std::string, Tensor>& inputs,
                  const std::vector<int>& experts) {
  std::memcpy(layer.params().w_router.raw(), in.gate->raw(), in.gate->nbytes());
  ExpertWeights& w = layer.params().experts;
  for (size_t l = 0; l < experts.size(); ++l) {
    const int e = experts[l];
    const auto li = static_cast<int64_t>(l);
    copy_rows(w.w1, li * in.h, inputs.at(expert_name(e, "w1")));
    copy_rows(w.w3, li * in.h, inputs.at(expert_name(e, "w3")));
    copy_rows(w.w2, li * in.d, inputs.at(expert_name(e, "w2")));
  }
}

// Every rank's forward and backward over its rows [offsets[r], offsets[r + 1]) of x and grad_y.
std::vector<RankOutput> run_layer_on_ranks(const LayerToolOptions& options, const MoeConfig& config,
                                           const MoeExecution& execution, const LayerInputs& in,
                                           const std::map<std::string, Tensor>& inputs,
                                           const std::vector<int64_t>& offsets) {
  // Throws unless M_E divides the ranks and the experts, suggesting M_E values that do both.
  TrainingLayoutConfig lc{options.ranks, options.ep};
  lc.num_experts = config.router.num_experts;
  const TrainingLayout layout(lc);
  config.validate();
  execution.validate(config, options.ep);
  const auto groups = layout.groups(TrainingGroup::EpMp);
  std::vector<RankOutput> outs(static_cast<size_t>(options.ranks));
  // A rank's tensors are charged to its own tracker, which ends with run_ranks: what a rank hands back is
  // cloned under this thread's tracker.
  MemoryTracker& host = current_tracker();
  LaunchOptions launch;
  launch.ranks = options.ranks;
  launch.ranks_per_node = options.ranks_per_node;
  run_ranks(launch, [&](Comm& world) {
    const int rank = world.rank();
    auto ep_group = world.subgroup(groups, "ep_mp");
    MoeLayer layer(config, execution, *ep_group, "moe");
    RankOutput& out = outs[static_cast<size_t>(rank)];
    out.experts = layer.placement().local_experts(layer.ep_rank());
    load_weights(layer, in, inputs, out.experts);
    const int64_t begin = offsets[static_cast<size_t>(rank)], end = offsets[static_cast<size_t>(rank) + 1];
    MoeState state;
    const Tensor y = layer.forward(in.x->rows(begin, end), state);
    const Tensor gx = layer.backward(in.grad_y.rows(begin, end), state);
    TrackerBinding bind(host);
    out.y = y.clone();
    out.grad_x = gx.clone();
    out.topk_idx = state.router.topk_idx.clone();
    out.topk_weight = state.router.topk_weight.clone();
    out.dst_row = state.routes.dst_row.clone();
    out.grad_router = layer.grads().w_router.clone();
    out.grad_experts = {layer.grads().experts.w1.clone(), layer.grads().experts.w3.clone(),
                        layer.grads().experts.w2.clone()};
    out.dropped = state.routes.dropped;
    out.utilisation = state.metrics.utilisation;
  });
  return outs;
}

// The ranks' outputs as the tool's output tensors, assembled in rank order so the sums are deterministic.
std::map<std::string, Tensor> assemble_outputs(const std::vector<RankOutput>& outs, const LayerInputs& in,
                                               const std::vector<int64_t>& offsets, int top_k) {
  const int64_t n = in.n, d = in.d, h = in.h;
  const int e_count = in.e_count, k = top_k;
  const int ranks = static_cast<int>(outs.size());
  std::map<std::string, Tensor> result;
  Tensor y = Tensor::empty({n, d}), grad_x = Tensor::empty({n, d});
  Tensor topk_idx = Tensor::empty({n, k}, DType::I32), topk_weight = Tensor::empty({n, k});
  Tensor route_dropped = Tensor::zeros({n, k}, DType::I32);
  Tensor grad_gate = Tensor::zeros({e_count, d});
  std::vector<Tensor> g1, g3, g2;
  for (int e = 0; e < e_count; ++e) {
    g1.push_back(Tensor::zeros({h, d}));
    g3.push_back(Tensor::zeros({h, d}));
    g2.push_back(Tensor::zeros({d, h}));
  }
  Tensor dropped = Tensor::empty({ranks}, DType::I64);
  double drop_rate = 0.0, utilisation = 0.0;
  for (int r = 0; r < ranks; ++r) {
    const RankOutput& o = outs[static_cast<size_t>(r)];
    const int64_t at = offsets[static_cast<size_t>(r)], t = in.tokens[static_cast<size_t>(r)];
    copy_rows(y, at, o.y);
    copy_rows(grad_x, at, o.grad_x);
    copy_rows(topk_idx, at, o.topk_idx);
    copy_rows(topk_weight, at, o.topk_weight);
    for (int64_t i = 0; i < t * k; ++i)
      route_dropped.data<int32_t>()[at * k + i] =
          o.topk_idx.data<int32_t>()[i] >= 0 && o.dst_row.data<int32_t>()[i] < 0;
    add_into(grad_gate, o.grad_router);
    for (size_t l = 0; l < o.experts.size(); ++l) {
      const auto li = static_cast<int64_t>(l);
      const auto e = static_cast<size_t>(o.experts[l]);
      add_into(g1[e], o.grad_experts.w1.rows(li, li + 1).reshape({h, d}));
      add_into(g3[e], o.grad_experts.w3.rows(li, li + 1).reshape({h, d}));
      add_into(g2[e], o.grad_experts.w2.rows(li, li + 1).reshape({d, h}));
    }
    dropped.data<int64_t>()[r] = o.dropped;
    if (t > 0) drop_rate += static_cast<double>(o.dropped) / static_cast<double>(t * k);
    utilisation = std::max(utilisation, o.utilisation);
  }
  Tensor drop_rate_t = Tensor::empty({1}, DType::F64), utilisation_t = Tensor::empty({1}, DType::F64);
  drop_rate_t.data<double>()[0] = drop_rate / ranks;
  utilisation_t.data<double>()[0] = utilisation;
  result["y"] = y;
  result["grad_x"] = grad_x;
  result["topk_idx"] = topk_idx;
  result["topk_weight"] = topk_weight;
  result["route_dropped"] = route_dropped;
  result["grad.gate.weight"] = grad_gate;
  for (int e = 0; e < e_count; ++e) {
    result["grad." + expert_name(e, "w1")] = g1[static_cast<size_t>(e)];
    result["grad." + expert_name(e, "w3")] = g3[static_cast<size_t>(e)];
    result["grad." + expert_name(e, "w2")] = g2[static_cast<size_t>(e)];
  }
  result["metrics.dropped"] = dropped;
  result["metrics.drop_rate"] = drop_rate_t;
  result["metrics.utilisation"] = utilisation_t;
  return result;
}

}  // namespace

std::map<std::string, Tensor> run_layer_tool(const std::map<std::string, Tensor>& inputs,
                                             const LayerToolOptions& options) {
  const LayerInputs in = read_layer_inputs(inputs, options);
  const MoeConfig config = layer_config(options, in);
  std::vector<int64_t> offsets(static_cast<size_t>(options.ranks) + 1, 0);
  for (int r = 0; r < options.ranks; ++r)
    offsets[static_cast<size_t>(r) + 1] = offsets[static_cast<size_t>(r)] + in.tokens[static_cast<size_t>(r)];
  const std::vector<RankOutput> outs =
      run_layer_on_ranks(options, config, layer_execution(options), in, inputs, offsets);
  return assemble_outputs(outs, in, offsets, options.top_k);
}

void run_layer_tool_file(const std::filesystem::path& input, const std::filesystem::path& output,
                         const LayerToolOptions& options) {
  const SafetensorsFile file = SafetensorsFile::open(input);
  std::map<std::string, Tensor> inputs;
  for (const std::string& name : file.names()) inputs[name] = file.read(name);
  const std::map<std::string, Tensor> outputs = run_layer_tool(inputs, options);
  const std::map<std::string, std::string> metadata{
      {"ranks", std::to_string(options.ranks)},
      {"ep", std::to_string(options.ep)},
      {"path", options.path},
      {"top_k", std::to_string(options.top_k)},
      {"score", options.score},
      {"renormalize", options.renormalize ? "true" : "false"},
      {"capacity_factor", fmt::format("{}", options.capacity_factor)},
      {"capacity_policy", options.capacity_factor > 0.0 ? options.capacity_policy : "dropless"},
      {"precision", options.precision.describe()},
      {"waves", fmt::format("{}{}", options.waves.waves, options.waves.overlap ? " overlapped" : "")},
  };
  write_safetensors(output, outputs, metadata);
}

}  // namespace expar
