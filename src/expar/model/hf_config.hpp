#pragma once
// Hugging Face config.json -> Architecture, for every family in architecture.hpp, in both key layouts in
// circulation: transformers v4 (rope_theta, rope_scaling) and v5 (rope_parameters {rope_type, rope_theta,
// ...}). A key that is absent takes the family's reference default (transformers' configuration_*.py).
//
// Nothing changes the function silently: every key is either read (and honoured), known to leave the logits
// unchanged (token ids, dtype, dropout, loss coefficients, ...), or refused with an expar::Error that names
// config.json, the key, its value and what is supported; so is a key expar does not know. Numbers are
// checked (counts positive, heads divisible by key/value heads, floats finite).
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "expar/model/architecture.hpp"

namespace expar {

// `config` is a parsed config.json; `label` names it in messages (its path). With `expected`, a model_type
// that says otherwise throws naming both.
Architecture hf_architecture(const nlohmann::json& config, const std::string& label,
                             std::optional<ModelFormat> expected = std::nullopt);

// Reads and parses dir/config.json (throws naming the file when it is missing or not JSON).
nlohmann::json read_hf_config_json(const std::filesystem::path& dir);

// read_hf_config_json + hf_architecture.
Architecture read_hf_architecture(const std::filesystem::path& dir,
                                  std::optional<ModelFormat> expected = std::nullopt);

}  // namespace expar
