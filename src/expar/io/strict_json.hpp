#pragma once
// Strict JSON parsing for file headers we do not trust (safetensors headers, checkpoint indexes).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace expar {

// Parses `text` as one JSON document. Unlike plain nlohmann::json::parse, a duplicate key in any object is an
// error (nlohmann would silently keep the last one, so two readers could disagree on what a file holds),
// and containers nested deeper than `max_depth` are rejected before they are built (a schema with a known
// depth needs no more, and a deep document would only cost memory and stack). Throws expar::Error whose
// message starts with `label`.
nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth);

// `value` rendered for an error message: compact JSON, cut to about `max_chars` characters.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);
// `text` cut to about `max_chars` characters for an error message (names can be megabytes long).
std::string text_excerpt(std::string_view text, size_t max_chars = 120);

}  // namespace expar
