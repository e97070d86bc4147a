#pragma once
// Typed field access for tokenizer.json components with errors that say which component and field is wrong.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"

namespace expar::tok {

inline std::string component_type(const nlohmann::json& config, std::string_view what) {
  EXPAR_CHECK(config.is_object() && config.contains("type") && config["type"].is_string(),
              "tokenizer.json: {} {} has no string \"type\": expected an object like {{\"type\": ...}}", what,
              json_excerpt(config));
  return config["type"].get<std::string>();
}

template <typename T>
T field_or(const nlohmann::json& config, const char* key, T fallback, std::string_view what) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  try {
    return config[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    fail("tokenizer.json: {} field \"{}\" = {} has the wrong type", what, key, json_excerpt(config[key]));
  }
}

// The steps of a Sequence component: each item of the array `config[key]` made by `make` (null items
// skipped).
template <typename Component, typename Make>
std::vector<std::unique_ptr<Component>> sequence_steps(const nlohmann::json& config, const char* key,
                                                       std::string_view what, Make&& make) {
  const auto& list = config.value(key, nlohmann::json::array());
  EXPAR_CHECK(list.is_array(), "tokenizer.json: {} Sequence has no \"{}\" array", what, key);
  std::vector<std::unique_ptr<Component>> steps;
  for (const auto& item : list)
    if (auto step = make(item)) steps.push_back(std::move(step));
  return steps;
}

[[noreturn]] inline void unsupported(std::string_view what, std::string_view type,
                                     std::string_view supported) {
  fail("tokenizer.json: {} type \"{}\" is not supported (supported: {})", what, type, supported);
}

}  // namespace expar::tok
