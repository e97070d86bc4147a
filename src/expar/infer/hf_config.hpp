#pragma once
// Hugging Face config.json -> ModelConfig, for the architectures the engine runs end to end.
#include <filesystem>

#include "expar/model/model_config.hpp"

namespace expar::infer {

// Mixtral (model_type "mixtral"): softmax router, top-k, weights renormalised over the k (Mixtral's
// routing), SwiGLU experts w1 (gate), w3 (up), w2 (down), rotate-half RoPE. Throws expar::Error naming the
// field when one is missing or the model_type is not mixtral.
ModelConfig mixtral_config(const std::filesystem::path& dir);

}  // namespace expar::infer
