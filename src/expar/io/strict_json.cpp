#include "expar/io/strict_json.hpp"

#include <set>
#include <vector>

#include "expar/core/error.hpp"

namespace expar {

nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;
  int depth = 0;
  json::parser_callback_t on_event = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        ++depth;
        EXPAR_CHECK(depth <= max_depth,
                    "{}: JSON nests containers {} deep, more than the {} levels its schema has: the file is "
                    "corrupt or not of this kind",
                    label, depth, max_depth);
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        --depth;
        open_objects.pop_back();
        break;
      case json::parse_event_t::array_end:
        --depth;
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        EXPAR_CHECK(open_objects.back().insert(key).second,
                    "{}: duplicate key \"{}\" in a JSON object: every key may appear once (readers would "
                    "disagree on which value holds)",
                    label, text_excerpt(key));
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", label, e.what());
  }
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

std::string text_excerpt(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "...";
}

}  // namespace expar
