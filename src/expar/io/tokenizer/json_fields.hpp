#pragma once
// Typed field access for tokenizer.json components with errors that say which component and field is wrong.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

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

[[noreturn]] inline void unsupported(std::string_view what, std::string_view type,
                                     std::string_view supported) {
  fail("tokenizer.json: {} type \"{}\" is not supported (supported: {})", what, type, supported);
}

}  // namespace expar::tok
