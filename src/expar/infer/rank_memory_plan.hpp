#pragma once
// What each inference rank will hold, known before anything is loaded: its weights by the format it holds
// them in (core/weight_view.hpp: F32, BF16 and F16 as stored, MXFP4 experts as stored where the shard covers
// whole blocks, anything else widened to f32), which of them it uses in place from the mapped file, and its
// KV cache. Computed from the checkpoint's tensor headers and the layout by the rules load_rank_weights
// follows (rank_weights.cpp), so `expar plan --kv-tokens` and the refusal before loading in generate, eval,
// serve and bench generate show the bytes the load would allocate (tests/infer/rank_memory_plan_test
// compares them with the memory trackers after real loads).
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "expar/core/weight_view.hpp"
#include "expar/infer/generate.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/model/tensor_store.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::infer {

inline constexpr size_t kWeightFormatCount = 5;  // WeightFormat's values

struct RankMemoryPlan {
  int rank = 0;
  // Heap copies, by the format held (index: WeightFormat), and by tracker category.
  std::array<int64_t, kWeightFormatCount> held_bytes{};
  int64_t dense_bytes = 0;   // MemCategory::DenseWeights: embedding/LM head, attention, norms, router, shared
  int64_t expert_bytes = 0;  // MemCategory::ExpertWeights: the local routed experts (and their biases)
  // MemCategory::MappedWeights: used in place from the mapped file (the embedding table where it can);
  // only the pages a step touches become resident, so the fit check does not count them.
  int64_t mapped_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // every layer's keys and values of one position, for the heads held here
  int64_t kv_tokens = 0;           // positions planned for
  int64_t kv_bytes() const { return kv_bytes_per_token * kv_tokens; }
  // What the rank allocates: its weight copies and its KV cache.
  int64_t heap_bytes() const { return dense_bytes + expert_bytes + kv_bytes(); }
};

// Rank `rank`'s plan from the headers of `store` (nothing is read but the headers); `weight_dtype` as
// load_rank_weights takes it.
RankMemoryPlan plan_rank_memory(const TensorStore& store, const ModelSpec& spec,
                                const InferenceLayout& layout, int rank, int64_t kv_tokens,
                                std::optional<DType> weight_dtype = std::nullopt);
// Whether `spec` is a Hugging Face config without weights (its directory holds no model.safetensors or
// index): its plan assumes the storage the config says (model/config_tensor_store.hpp's StoredWeights).
bool planned_from_config(const ModelSpec& spec);
// The store a plan reads its headers from: the checkpoint's (open_store), or one made from its config.
std::unique_ptr<TensorStore> open_planning_store(const ModelSpec& spec);
// Every rank's, opening the planning store once.
std::vector<RankMemoryPlan> plan_inference_memory(const ModelSpec& spec, const InferenceLayout& layout,
                                                  int64_t kv_tokens,
                                                  std::optional<DType> weight_dtype = std::nullopt);
// Every layer's keys and values of one position for rank `rank`'s key/value heads (the KV cache holds f32);
// with latent attention, every layer's latent and rope key (the compressed cache, whole on every TP rank).
int64_t kv_bytes_per_token(const ModelConfig& config, const ModelFeatures& features,
                           const InferenceLayout& layout, int rank);

// "bf16 1.20 GiB + f32 3.1 MiB" (the formats held, largest first), "+ mapped 0.5 GiB" when some are used in
// place.
std::string format_held_bytes(const RankMemoryPlan& plan);

// One line per run of ranks with the same plan: "  ranks 0-3: mxfp4 1.10 GiB + bf16 210.00 MiB, KV cache
// 12.00 MiB (96 positions)".
std::string format_rank_plans(const std::vector<RankMemoryPlan>& plans);

// Memory kept free beside the weights and the KV cache for activations, scratch and the loader's transient
// copies, per process.
inline constexpr int64_t kInferenceReserveBytes = int64_t{1} << 30;

struct FitRequest {
  const ModelSpec* spec = nullptr;
  GenerateOptions options;  // the layout asked for
  int64_t kv_tokens = 0;    // KV positions each rank holds
  // The ranks of this process (empty: every rank of the layout: the threads transport). The bytes it may
  // use are options.memory_limit_bytes, or (0) what the machine has available now
  // (available_host_memory_bytes, shared evenly with the other processes of an MPI job on this node).
  std::vector<int> hosted_ranks;
  // The flag that sets the KV positions and its value for `tokens` positions per rank ("--kv-cache-mb 64"),
  // or empty when the command has no such flag: offered when a smaller KV cache would fit.
  std::function<std::optional<std::string>(int64_t tokens)> kv_fix;
};

// Throws expar::Error before any weight is read when the ranks this process hosts need more than its limit:
// the message names the bytes needed (weights by format, KV cache, reserve), the bytes available, and a
// layout or KV setting that would fit (computed with the same plan), or says that none does.
void check_fits_before_loading(const FitRequest& request);

}  // namespace expar::infer
