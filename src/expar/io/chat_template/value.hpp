#pragma once
// The values a chat template computes with: Jinja's (Python's) types, with reference semantics for lists,
// dicts and namespaces (a `set ns.x = ...` inside a loop is seen after it, as in Jinja).
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace expar::jinja {

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python dicts keep it
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(std::vector<Value>& args, Kwargs& kwargs)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> array;
  std::shared_ptr<Object> object;
  std::shared_ptr<Function> function;
  bool is_namespace = false;

  static Value none() { return make(Kind::None); }
  static Value boolean(bool v) {
    Value x = make(Kind::Bool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = make(Kind::Int);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = make(Kind::Float);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = make(Kind::String);
    x.s = std::move(v);
    return x;
  }
  static Value list(Array items = {}) {
    Value x = make(Kind::Array);
    x.array = std::make_shared<Array>(std::move(items));
    return x;
  }
  static Value dict(Object items = {}) {
    Value x = make(Kind::Object);
    x.object = std::make_shared<Object>(std::move(items));
    return x;
  }
  static Value callable(Function fn) {
    Value x = make(Kind::Function);
    x.function = std::make_shared<Function>(std::move(fn));
    return x;
  }
  static Value from_json(const nlohmann::json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool truthy() const;
  double number() const { return kind == Kind::Int ? static_cast<double>(i) : kind == Kind::Bool ? b : f; }
  // The member `key` of a dict or namespace (Undefined when absent or not a dict).
  Value get(const std::string& key) const;
  void set(const std::string& key, Value v);
  std::string type_name() const;

 private:
  static Value make(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

// What {{ value }} prints (Python's str(): None, True, 1.0, ['a', 1], {'k': 'v'}).
std::string to_output(const Value& v);
// Python's repr() of a value inside a container.
std::string to_repr(const Value& v);
// The tojson filter: JSON with Python's json.dumps separators (", " and ": "), not ASCII-escaped.
std::string to_json(const Value& v, int indent, int depth = 0);
bool equal(const Value& a, const Value& b);

}  // namespace expar::jinja
