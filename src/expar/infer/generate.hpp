#pragma once
// Greedy decoding on the engine, and the one-call library entry point behind `expar generate`.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "expar/core/memory.hpp"
#include "expar/infer/engine.hpp"
#include "expar/infer/hf_config.hpp"
#include "expar/topo/inference_layout.hpp"

namespace expar::infer {

// Greedy decoding of one sequence per DP replica (collective over the world): prefill `prompt`, then
// `max_new` decode steps, each feeding back the arg-max token (ties to the lower id). A replica with an empty
// prompt is idle: it runs zero-token steps (DP padding) while its peers decode. Returns the new tokens.
std::vector<int32_t> greedy_generate(Engine& engine, const std::vector<int32_t>& prompt, int max_new);

// Index of the largest value of row `row` of logits [N, V] (ties to the lower index).
int32_t argmax_row(const Tensor& logits, int64_t row);

// The run's parallelism (topo/inference_layout.hpp) and how its ranks compute.
struct GenerateOptions : InferenceParallelism {
  int compute_threads = 1;                      // oneDNN threads per rank
  std::optional<ModelFormat> format;            // unset: detected from the files (open_model_spec)
  DecodeMoe decode_moe = DecodeMoe::AllReduce;  // how decode steps run the MoE layers (engine.hpp)
  // The bytes this process may hold; a model whose weights and KV cache need more is refused before
  // loading (rank_memory_plan.hpp). 0: what the machine has available.
  int64_t memory_limit_bytes = 0;
  // BF16: the weights the products multiply (attention, LM head, experts, shared expert), where the
  // checkpoint stores them in F32, converted at load (rounded to nearest, ties to even), for half their
  // bytes; F8E4M3: those stored in F32, BF16 or F16 converted to block-scaled FP8 (core/tensor_convert.hpp's
  // to_fp8_blocks); unset: every weight as stored (rank_weights.hpp).
  std::optional<DType> weight_dtype;
  ProductPrecision precision = ProductPrecision::F32;  // the products' operands (EngineOptions::precision)
};

// The engine options of `options` (decode_moe, precision).
EngineOptions engine_options_for(const GenerateOptions& options);

// The TP x DP layout of `options` for `config` (validated: throws expar::Error naming the rule).
InferenceLayout inference_layout(const GenerateOptions& options, const ModelConfig& config);

struct GenerateResult {
  ModelFormat format = ModelFormat::Expar;  // the checkpoint's format
  int ep_degree = 1;                        // the layout's (1: no EP)
  std::vector<int32_t> tokens;              // the generated tokens (DP replica 0's)
  double prefill_tokens_per_s = 0.0;
  double decode_tokens_per_s = 0.0;
  // Per rank at the end of the run, before the engine is destroyed: current = what the rank holds (its
  // weights by category: copies, or MappedWeights used in place from the file), peak = the high-water mark
  // of loading and generation (KV cache included).
  std::vector<MemorySnapshot> memory;
  int64_t peak_rss_bytes = 0;  // the process's peak resident set (peak_resident_bytes)
};

// Starts TP*DP ranks (threads), loads `checkpoint` (a directory or a file in one, see open_model_spec: ours,
// or Hugging Face Mixtral, Qwen-MoE, Qwen3-MoE, OLMoE or gpt-oss: config.json +
// model.safetensors[.index.json]), and greedily generates `max_new` tokens after `prompt` on DP replica 0
// (other replicas run the DP-padding dummy steps).
GenerateResult generate(const GenerateOptions& options, const std::string& checkpoint,
                        const std::vector<int32_t>& prompt, int max_new);

}  // namespace expar::infer
