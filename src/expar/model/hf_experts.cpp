#include "expar/model/hf_experts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "expar/model/gpt_oss_layout.hpp"
#include "expar/model/weight_loader.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

namespace {

// Per-expert tensors (names.expert(layer, e, w1|w3|w2)) in PyTorch [out, in] orientation, as Mixtral and
// Qwen-MoE store them.
ExpertWeights load_per_expert(const TensorStore& store, const WeightNames& names, int layer,
                              std::span<const int> local, int64_t i0, int64_t i1) {
  auto view = [&](const char* key) {
    return per_expert_view(store,
                           [names, layer, k = std::string(key)](int e) { return names.expert(layer, e, k); });
  };
  ExpertWeights w;
  w.w1 = expert_parallel_weight_loader(local, rows_loader(view("w1"), i0, i1));
  w.w3 = expert_parallel_weight_loader(local, rows_loader(view("w3"), i0, i1));
  w.w2 = expert_parallel_weight_loader(local, columns_loader(view("w2"), i0, i1));
  w.validate();
  return w;
}

}  // namespace

ExpertWeights load_mixtral_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1) {
  return load_per_expert(store, mixtral_weight_names(), layer, local_experts, i0, i1);
}

ExpertWeights load_qwen_moe_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                    int64_t i0, int64_t i1) {
  return load_per_expert(store, qwen_moe_weight_names(), layer, local_experts, i0, i1);
}

QwenSharedExpert load_qwen_shared_expert(const TensorStore& store, int layer, int64_t s0, int64_t s1) {
  const WeightNames names = qwen_moe_weight_names();
  QwenSharedExpert s;
  s.w1 = load_rows(store, names.shared(layer, "w1"), s0, s1);
  s.w3 = load_rows(store, names.shared(layer, "w3"), s0, s1);
  s.w2 = load_columns(store, names.shared(layer, "w2"), s0, s1);
  s.gate = load_dense(store, names.shared(layer, "gate"));
  return s;
}

namespace {

// The gate/up biases of the shard and (owns_down_bias) the down bias.
void load_gpt_oss_biases(const TensorStore& store, int layer, std::span<const int> local_experts, int64_t i0,
                         int64_t i1, bool owns_down_bias, GptOssExperts& g) {
  const auto names = gpt_oss_expert_names(layer);
  const ExpertView gate_up_bias = stacked_expert_view(store, names[kGateUpBias]);
  auto squeeze = [](Tensor t) { return t.reshape({t.dim(0), t.dim(2)}); };  // [E_L, 1, n] -> [E_L, n]
  g.b1 = squeeze(expert_parallel_weight_loader(local_experts, columns_loader(gate_up_bias, i0, i1, 2, 0)));
  g.b3 = squeeze(expert_parallel_weight_loader(local_experts, columns_loader(gate_up_bias, i0, i1, 2, 1)));
  if (owns_down_bias)
    g.b2 = squeeze(expert_parallel_weight_loader(
        local_experts, identity_loader(stacked_expert_view(store, names[kDownBias]))));
}

// The local experts of a stacked tensor [E, a, b, ...] as they are stored, of each only [b0, b1) along its
// `axis` (1 or 2): [E_L, ..., b1 - b0, ...]. The caller gives the mapped pages back (load_rank_weights
// releases every expert tensor it read).
Tensor stack_local_experts(const TensorStore& store, const std::string& name, std::span<const int> local,
                           int axis, int64_t b0, int64_t b1) {
  const TensorInfo& info = store.info(name);
  Shape shape = info.shape;
  shape[0] = static_cast<int64_t>(local.size());
  shape[static_cast<size_t>(axis)] = b1 - b0;
  Tensor out = Tensor::empty(shape, info.dtype, MemCategory::ExpertWeights);
  // Rows of the copy: the product of the dimensions before `axis` (after the expert's); runs: its bytes.
  int64_t outer = 1, inner = static_cast<int64_t>(dtype_size(info.dtype));
  for (int i = 1; i < axis; ++i) outer *= info.shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < info.shape.size(); ++i) inner *= info.shape[i];
  const int64_t stored_row = info.shape[static_cast<size_t>(axis)] * inner, run = (b1 - b0) * inner;
  auto* o = static_cast<char*>(out.raw());
  for (size_t l = 0; l < local.size(); ++l) {
    const Tensor v = store.view_rows(name, local[l], local[l] + 1);
    const auto* in = static_cast<const char*>(v.raw()) + b0 * inner;
    for (int64_t r = 0; r < outer; ++r, o += run)
      std::memcpy(o, in + r * stored_row, static_cast<size_t>(run));
  }
  return out;
}

}  // namespace

GptOssExperts load_gpt_oss_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1, bool owns_down_bias) {
  const auto names = gpt_oss_expert_names(layer);
  GptOssExperts g;
  // gate_up_proj [H, 2I] per expert is [in, out]: take the shard's even (gate) / odd (up) columns,
  // transposed to [n, H]; down_proj [I, H] is [in, out]: its shard rows, transposed to [H, n].
  const ExpertView gate_up = stacked_expert_view(store, names[kGateUp]);
  g.weights.w1 = expert_parallel_weight_loader(local_experts, columns_loader(gate_up, i0, i1, 2, 0, true));
  g.weights.w3 = expert_parallel_weight_loader(local_experts, columns_loader(gate_up, i0, i1, 2, 1, true));
  g.weights.w2 = expert_parallel_weight_loader(
      local_experts, rows_loader(stacked_expert_view(store, names[kDown]), i0, i1, true));
  g.weights.validate();
  load_gpt_oss_biases(store, layer, local_experts, i0, i1, owns_down_bias, g);
  return g;
}

GptOssExperts load_gpt_oss_experts_as_stored(const TensorStore& store, int layer,
                                             std::span<const int> local_experts, int64_t i0, int64_t i1,
                                             bool owns_down_bias) {
  const auto names = gpt_oss_expert_names(layer);
  const std::string &gu = names[kGateUp], &dn = names[kDown];
  const bool quantised = store.contains(gu + "_blocks") && store.contains(dn + "_blocks");
  if (!quantised || i0 % kMxfp4Block != 0 ||
      (i1 % kMxfp4Block != 0 && i1 != store.info(dn + "_blocks").shape[2] * kMxfp4Block))
    return load_gpt_oss_experts(store, layer, local_experts, i0, i1, owns_down_bias);
  GptOssExperts g;
  // Only the shard: gate_up's rows [2·i0, 2·i1) (gate and up interleaved) and down's input blocks
  // [i0/32, i1/32), so a TP rank holds 1/TP of every expert as an EP rank holds 1/EP of the experts.
  const int64_t g0 = i0 / kMxfp4Block, g1 = (i1 + kMxfp4Block - 1) / kMxfp4Block;
  g.weights.mxfp4 = std::make_shared<const Mxfp4Experts>(
      Mxfp4Experts{stack_local_experts(store, gu + "_blocks", local_experts, 1, 2 * i0, 2 * i1),
                   stack_local_experts(store, gu + "_scales", local_experts, 1, 2 * i0, 2 * i1),
                   stack_local_experts(store, dn + "_blocks", local_experts, 2, g0, g1),
                   stack_local_experts(store, dn + "_scales", local_experts, 2, g0, g1), 0, i1 - i0});
  g.weights.validate();
  load_gpt_oss_biases(store, layer, local_experts, i0, i1, owns_down_bias, g);
  return g;
}

}  // namespace expar
