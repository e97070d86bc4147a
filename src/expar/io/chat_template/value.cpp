#include "expar/io/chat_template/value.hpp"

#include <fmt/format.h>

#include <cmath>

namespace expar::jinja {

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return none();
    case nlohmann::json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array items;
      for (const auto& x : j) items.push_back(from_json(x));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Object items;
      for (const auto& [k, x] : j.items()) items.emplace_back(k, from_json(x));
      return dict(std::move(items));
    }
    default:
      return Value();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b;
    case Kind::Int:
      return i != 0;
    case Kind::Float:
      return f != 0.0;
    case Kind::String:
      return !s.empty();
    case Kind::Array:
      return !array->empty();
    case Kind::Object:
      return is_namespace || !object->empty();
    case Kind::Function:
      return true;
  }
  return false;
}

Value Value::get(const std::string& key) const {
  if (kind != Kind::Object) return Value();
  for (const auto& [k, v] : *object)
    if (k == key) return v;
  return Value();
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, x] : *object)
    if (k == key) {
      x = std::move(v);
      return;
    }
  object->emplace_back(key, std::move(v));
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::Undefined:
      return "undefined";
    case Kind::None:
      return "none";
    case Kind::Bool:
      return "boolean";
    case Kind::Int:
      return "integer";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "string";
    case Kind::Array:
      return "list";
    case Kind::Object:
      return is_namespace ? "namespace" : "dict";
    case Kind::Function:
      return "function";
  }
  return "?";
}

namespace {

std::string float_text(double f) {
  if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 1e16) return fmt::format("{:.1f}", f);
  return fmt::format("{}", f);
}

std::string quote_python(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  out.push_back(q);
  return out;
}

}  // namespace

std::string to_output(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.b ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.i);
    case Value::Kind::Float:
      return float_text(v.f);
    case Value::Kind::String:
      return v.s;
    default:
      return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String:
      return quote_python(v.s);
    case Value::Kind::Array: {
      std::string out = "[";
      for (size_t k = 0; k < v.array->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.array)[k]);
      }
      return out + "]";
    }
    case Value::Kind::Object: {
      std::string out = "{";
      for (size_t k = 0; k < v.object->size(); ++k) {
        if (k) out += ", ";
        out += quote_python((*v.object)[k].first) + ": " + to_repr((*v.object)[k].second);
      }
      return out + "}";
    }
    case Value::Kind::Function:
      return "<function>";
    default:
      return to_output(v);
  }
}

std::string to_json(const Value& v, int indent, int depth) {
  std::string pad, child_pad;
  if (indent > 0) {
    pad.push_back('\n');
    pad.append(static_cast<size_t>(indent * depth), ' ');
    child_pad = pad;
    child_pad.append(static_cast<size_t>(indent), ' ');
  }
  const std::string item_sep = indent > 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return "null";
    case Value::Kind::Bool:
      return v.b ? "true" : "false";
    case Value::Kind::Int:
      return std::to_string(v.i);
    case Value::Kind::Float:
      return nlohmann::json(v.f).dump();
    case Value::Kind::String:
      return nlohmann::json(v.s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    case Value::Kind::Array: {
      if (v.array->empty()) return "[]";
      std::string out = "[";
      for (size_t k = 0; k < v.array->size(); ++k) {
        if (k) out += item_sep;
        out += child_pad + to_json((*v.array)[k], indent, depth + 1);
      }
      return out + pad + "]";
    }
    case Value::Kind::Object: {
      if (v.object->empty()) return "{}";
      std::string out = "{";
      for (size_t k = 0; k < v.object->size(); ++k) {
        if (k) out += item_sep;
        out += child_pad + nlohmann::json((*v.object)[k].first).dump() + ": " +
               to_json((*v.object)[k].second, indent, depth + 1);
      }
      return out + pad + "}";
    }
    case Value::Kind::Function:
      return "null";
  }
  return "null";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind == Value::Kind::Bool && b.kind == Value::Kind::Bool) return a.b == b.b;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.s == b.s;
    case Value::Kind::Array:
      if (a.array->size() != b.array->size()) return false;
      for (size_t k = 0; k < a.array->size(); ++k)
        if (!equal((*a.array)[k], (*b.array)[k])) return false;
      return true;
    case Value::Kind::Object:
      if (a.object->size() != b.object->size()) return false;
      for (const auto& [k, x] : *a.object)
        if (!equal(x, b.get(k))) return false;
      return true;
    default:
      return a.function == b.function;
  }
}

}  // namespace expar::jinja
