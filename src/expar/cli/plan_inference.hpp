#pragma once
// `expar plan --model DIR --kv-tokens N`: the inference plan. What each rank of an inference layout (--tp,
// --dp, --enable-expert-parallel, --ep, --placement) holds of a checkpoint, read from its tensor headers (or,
// for a Hugging Face directory with only config.json, from the tensors and storage its config describes):
// weights by the format held (infer/rank_memory_plan.hpp), those used in place from the file, and a KV cache
// of N positions; then the process's total against the memory the machine has available, by the rule
// generate, eval and serve refuse with before loading.
#include <cstdint>
#include <string>

#include "expar/cli/json_output.hpp"
#include "expar/infer/generate.hpp"

namespace expar::cli {

struct InferencePlanArgs {
  std::string model;  // a checkpoint directory (its safetensors headers are read) or its config.json
  infer::GenerateOptions options;
  int64_t kv_tokens = 0;
};

int run_inference_plan(const InferencePlanArgs& args, const JsonOutput& json);

}  // namespace expar::cli
