#include "expar/infer/hf_experts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "expar/infer/weight_loader.hpp"

namespace expar::infer {

namespace {

std::string layer_prefix(int layer) {
  return "model.layers." + std::to_string(layer);
}

// Per-expert tensors name(e, key) in PyTorch [out, in] orientation, as Mixtral and Qwen-MoE store them.
template <typename Name>
ExpertWeights load_per_expert(const TensorStore& store, std::span<const int> local, int64_t i0, int64_t i1,
                              Name name, const char* gate, const char* up, const char* down) {
  auto view = [&](const char* key) {
    return per_expert_view(store, [name, k = std::string(key)](int e) { return name(e, k); });
  };
  ExpertWeights w;
  w.w1 = expert_parallel_weight_loader(local, rows_loader(view(gate), i0, i1));
  w.w3 = expert_parallel_weight_loader(local, rows_loader(view(up), i0, i1));
  w.w2 = expert_parallel_weight_loader(local, columns_loader(view(down), i0, i1));
  w.validate();
  return w;
}

}  // namespace

ExpertWeights load_mixtral_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1) {
  const std::string p = layer_prefix(layer) + ".block_sparse_moe.experts.";
  return load_per_expert(
      store, local_experts, i0, i1,
      [p](int e, const std::string& k) { return p + std::to_string(e) + "." + k + ".weight"; }, "w1", "w3",
      "w2");
}

ExpertWeights load_qwen_moe_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                    int64_t i0, int64_t i1) {
  const std::string p = layer_prefix(layer) + ".mlp.experts.";
  return load_per_expert(
      store, local_experts, i0, i1,
      [p](int e, const std::string& k) { return p + std::to_string(e) + "." + k + ".weight"; }, "gate_proj",
      "up_proj", "down_proj");
}

QwenSharedExpert load_qwen_shared_expert(const TensorStore& store, int layer, int64_t s0, int64_t s1) {
  const std::string p = layer_prefix(layer) + ".mlp.shared_expert";
  QwenSharedExpert s;
  s.w1 = load_rows(store, p + ".gate_proj.weight", s0, s1);
  s.w3 = load_rows(store, p + ".up_proj.weight", s0, s1);
  s.w2 = load_columns(store, p + ".down_proj.weight", s0, s1);
  s.gate = load_dense(store, p + "_gate.weight");
  return s;
}

namespace {

// The gate/up biases of the shard and (owns_down_bias) the down bias.
void load_gpt_oss_biases(const TensorStore& store, const std::string& p, std::span<const int> local_experts,
                         int64_t i0, int64_t i1, bool owns_down_bias, GptOssExperts& g) {
  const ExpertView gate_up_bias = stacked_expert_view(store, p + "gate_up_proj_bias");
  auto squeeze = [](Tensor t) { return t.reshape({t.dim(0), t.dim(2)}); };  // [E_L, 1, n] -> [E_L, n]
  g.b1 = squeeze(expert_parallel_weight_loader(local_experts, columns_loader(gate_up_bias, i0, i1, 2, 0)));
  g.b3 = squeeze(expert_parallel_weight_loader(local_experts, columns_loader(gate_up_bias, i0, i1, 2, 1)));
  if (owns_down_bias)
    g.b2 = squeeze(expert_parallel_weight_loader(
        local_experts, identity_loader(stacked_expert_view(store, p + "down_proj_bias"))));
}

// The local experts' rows of a stacked tensor [E, ...], copied as they are stored (the caller gives the
// mapped pages back: load_rank_weights releases every expert tensor it read).
Tensor stack_local_experts(const TensorStore& store, const std::string& name, std::span<const int> local) {
  const TensorInfo& info = store.info(name);
  Shape shape = info.shape;
  shape[0] = static_cast<int64_t>(local.size());
  Tensor out = Tensor::empty(shape, info.dtype, MemCategory::ExpertWeights);
  const size_t per = local.empty() ? 0 : out.nbytes() / local.size();
  for (size_t l = 0; l < local.size(); ++l) {
    const Tensor v = store.view_rows(name, local[l], local[l] + 1);
    std::memcpy(static_cast<char*>(out.raw()) + l * per, v.raw(), per);
  }
  return out;
}

}  // namespace

GptOssExperts load_gpt_oss_experts(const TensorStore& store, int layer, std::span<const int> local_experts,
                                   int64_t i0, int64_t i1, bool owns_down_bias) {
  const std::string p = layer_prefix(layer) + ".mlp.experts.";
  GptOssExperts g;
  // gate_up_proj [H, 2I] per expert is [in, out]: take the shard's even (gate) / odd (up) columns,
  // transposed to [n, H]; down_proj [I, H] is [in, out]: its shard rows, transposed to [H, n].
  const ExpertView gate_up = stacked_expert_view(store, p + "gate_up_proj");
  g.weights.w1 = expert_parallel_weight_loader(local_experts, columns_loader(gate_up, i0, i1, 2, 0, true));
  g.weights.w3 = expert_parallel_weight_loader(local_experts, columns_loader(gate_up, i0, i1, 2, 1, true));
  g.weights.w2 = expert_parallel_weight_loader(
      local_experts, rows_loader(stacked_expert_view(store, p + "down_proj"), i0, i1, true));
  g.weights.validate();
  load_gpt_oss_biases(store, p, local_experts, i0, i1, owns_down_bias, g);
  return g;
}

GptOssExperts load_gpt_oss_experts_as_stored(const TensorStore& store, int layer,
                                             std::span<const int> local_experts, int64_t i0, int64_t i1,
                                             bool owns_down_bias) {
  const std::string p = layer_prefix(layer) + ".mlp.experts.";
  const std::string gu = p + "gate_up_proj", dn = p + "down_proj";
  const bool quantised = store.contains(gu + "_blocks") && store.contains(dn + "_blocks");
  if (!quantised || i0 % kMxfp4Block != 0 ||
      (i1 % kMxfp4Block != 0 && i1 != store.info(dn + "_blocks").shape[2] * kMxfp4Block))
    return load_gpt_oss_experts(store, layer, local_experts, i0, i1, owns_down_bias);
  GptOssExperts g;
  g.weights.mxfp4 = std::make_shared<const Mxfp4Experts>(
      Mxfp4Experts{stack_local_experts(store, gu + "_blocks", local_experts),
                   stack_local_experts(store, gu + "_scales", local_experts),
                   stack_local_experts(store, dn + "_blocks", local_experts),
                   stack_local_experts(store, dn + "_scales", local_experts), i0, i1});
  g.weights.validate();
  load_gpt_oss_biases(store, p, local_experts, i0, i1, owns_down_bias, g);
  return g;
}

}  // namespace expar::infer
