// The interpreter of parsed chat templates (ast.hpp): Jinja's scoping (a for loop's body has its own scope
// per iteration, so only namespace attributes carry values out of a loop), its operators, and the filters,
// tests, methods and globals that chat templates use.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "expar/core/error.hpp"
#include "expar/io/chat_template.hpp"
#include "expar/io/chat_template/ast.hpp"
#include "expar/io/tokenizer.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar {

namespace jinja {

namespace {

constexpr const char* kFilters =
    "abs, capitalize, count, d, default, first, float, int, items, join, last, length, list, lower, map, "
    "reject, rejectattr, replace, reverse, safe, select, selectattr, sort, string, title, tojson, trim, "
    "unique, "
    "upper";
constexpr const char* kTests =
    "boolean, callable, defined, divisibleby, eq, equalto, even, false, float, ge, gt, in, integer, "
    "iterable, le, "
    "lower, lt, mapping, ne, none, number, odd, sequence, string, true, undefined, upper";

// Python's str.strip family: `chars` given, or Unicode whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  if (!chars || chars->kind != Value::Kind::String) return std::string(tok::trim_white_space(s, left, right));
  return std::string(tok::strip_code_points(s, left, right, [&](char32_t cp) {
    for (size_t k = 0; k < chars->s.size();)
      if (tok::next_code_point(chars->s, k) == cp) return true;
    return false;
  }));
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const size_t start = k;
    tok::next_code_point(s, k);
    out.push_back(s.substr(start, k - start));
  }
  return out;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    c = static_cast<char>(alpha ? (start ? std::toupper(static_cast<unsigned char>(c))
                                         : std::tolower(static_cast<unsigned char>(c)))
                                : c);
    start = !alpha;
  }
  return out;
}

}  // namespace

class Renderer {
 public:
  Renderer(const std::string& source, const nlohmann::json& context) : src_(source) {
    frames_.emplace_back();
    auto& globals = frames_.back();
    globals["range"] = Value::callable([this](std::vector<Value>& a, Kwargs&) { return range(a); });
    globals["namespace"] = Value::callable([](std::vector<Value>& a, Kwargs& kw) {
      Value ns = Value::dict();
      ns.is_namespace = true;
      for (const Value& x : a)
        if (x.kind == Value::Kind::Object)
          for (const auto& [k, v] : *x.object) ns.set(k, v);
      for (auto& [k, v] : kw) ns.set(k, v);
      return ns;
    });
    globals["dict"] = Value::callable([](std::vector<Value>&, Kwargs& kw) {
      Value d = Value::dict();
      for (auto& [k, v] : kw) d.set(k, v);
      return d;
    });
    globals["raise_exception"] = Value::callable([](std::vector<Value>& a, Kwargs&) -> Value {
      fail("chat template raised an exception: {}",
           a.empty() ? std::string("(no message)") : to_output(a[0]));
    });
    globals["strftime_now"] = Value::callable([](std::vector<Value>& a, Kwargs&) {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buffer[256];
      const std::string format = a.empty() ? "%Y-%m-%d" : to_output(a[0]);
      const size_t n = std::strftime(buffer, sizeof buffer, format.c_str(), &tm);
      return Value::string(std::string(buffer, n));
    });
    if (context.is_object())
      for (const auto& [k, v] : context.items()) globals[k] = Value::from_json(v);
  }

  std::string render(const Body& body) {
    std::string out;
    exec(body, out);
    return out;
  }

 private:
  enum class Flow { Normal, Break, Continue };

  [[noreturn]] void error(const std::string& what, size_t pos) const {
    fail("chat template: {} at {}", what, position_of(src_, pos));
  }

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (auto found = it->find(name); found != it->end()) return found->second;
    return Value();
  }

  Flow exec(const Body& body, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = exec(*node, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::Text:
        out += n.text;
        return Flow::Normal;
      case Node::Kind::Output:
        out += to_output(eval(*n.expr));
        return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return exec(body, out);
        return exec(n.else_body, out);
      case Node::Kind::For:
        return exec_for(n, out);
      case Node::Kind::Set:
      case Node::Kind::SetBlock: {
        Value v;
        if (n.kind == Node::Kind::Set) {
          v = eval(*n.expr);
        } else {
          std::string text;
          exec(n.body, text);
          v = Value::string(text);
        }
        if (n.attr.empty()) {
          frames_.back()[n.text] = v;
        } else {
          Value target = lookup(n.text);
          if (!target.is_namespace)
            error(fmt::format("set {}.{}: {} is a {}, not a namespace()", n.text, n.attr, n.text,
                              target.type_name()),
                  n.pos);
          target.set(n.attr, v);
        }
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        const Node* macro = &n;
        frames_.back()[n.text] = Value::callable([this, macro](std::vector<Value>& args, Kwargs& kwargs) {
          frames_.emplace_back();
          for (size_t p = 0; p < macro->params.size(); ++p) {
            const auto& [name, fallback] = macro->params[p];
            Value v = p < args.size() ? args[p] : Value();
            for (auto& [k, x] : kwargs)
              if (k == name) v = x;
            if (v.is_undefined() && fallback) v = eval(*fallback);
            frames_.back()[name] = v;
          }
          std::string text;
          exec(macro->body, text);
          frames_.pop_back();
          return Value::string(text);
        });
        return Flow::Normal;
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  std::vector<Value> iterate(const Value& v, size_t pos) const {
    switch (v.kind) {
      case Value::Kind::Array:
        return *v.array;
      case Value::Kind::Object: {
        std::vector<Value> keys;
        for (const auto& [k, x] : *v.object) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::String: {
        std::vector<Value> chars;
        for (auto& c : code_points(v.s)) chars.push_back(Value::string(c));
        return chars;
      }
      case Value::Kind::Undefined:
      case Value::Kind::None:
        return {};
      default:
        error(fmt::format("cannot iterate over a {}", v.type_name()), pos);
    }
  }

  void bind(const std::vector<std::string>& vars, const Value& item, size_t pos) {
    if (vars.size() == 1) {
      frames_.back()[vars[0]] = item;
      return;
    }
    if (item.kind != Value::Kind::Array || item.array->size() != vars.size())
      error(fmt::format("cannot unpack a {} into {} loop variables", item.type_name(), vars.size()), pos);
    for (size_t k = 0; k < vars.size(); ++k) frames_.back()[vars[k]] = (*item.array)[k];
  }

  Flow exec_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.expr), n.pos);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        frames_.emplace_back();
        bind(n.vars, item, n.pos);
        if (eval(*n.filter).truthy()) kept.push_back(item);
        frames_.pop_back();
      }
      items.swap(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < length; ++k) {
      frames_.emplace_back();
      Value loop = Value::dict({{"index", Value::integer(k + 1)},
                                {"index0", Value::integer(k)},
                                {"first", Value::boolean(k == 0)},
                                {"last", Value::boolean(k == length - 1)},
                                {"length", Value::integer(length)},
                                {"revindex", Value::integer(length - k)},
                                {"revindex0", Value::integer(length - k - 1)},
                                {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value()},
                                {"nextitem", k + 1 < length ? items[static_cast<size_t>(k + 1)] : Value()}});
      frames_.back()["loop"] = loop;
      bind(n.vars, items[static_cast<size_t>(k)], n.pos);
      const Flow flow = exec(n.body, out);
      frames_.pop_back();
      if (flow == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value range(const std::vector<Value>& a) const {
    int64_t start = 0, stop = 0, step = 1;
    if (a.size() == 1) stop = a[0].i;
    if (a.size() >= 2) {
      start = a[0].i;
      stop = a[1].i;
    }
    if (a.size() >= 3) step = a[2].i;
    Array items;
    if (step == 0) return Value::list();
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::integer(k));
    return Value::list(std::move(items));
  }

  std::pair<std::vector<Value>, Kwargs> eval_args(const Expr& e, size_t skip) {
    std::vector<Value> args;
    for (size_t k = skip; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    Kwargs kwargs;
    for (const auto& [name, x] : e.kwargs) kwargs.emplace_back(name, eval(*x));
    return {std::move(args), std::move(kwargs)};
  }

  static const Value* arg(const std::vector<Value>& args, const Kwargs& kwargs, size_t index,
                          const char* name) {
    for (const auto& [k, v] : kwargs)
      if (k == name) return &v;
    return index < args.size() ? &args[index] : nullptr;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name:
        return lookup(e.name);
      case Expr::Kind::Attr: {
        const Value target = eval(*e.args[0]);
        return target.get(e.name);
      }
      case Expr::Kind::Index:
        return index(eval(*e.args[0]), eval(*e.args[1]), e.pos);
      case Expr::Kind::Slice:
        return slice(e);
      case Expr::Kind::Call:
        return call(e);
      case Expr::Kind::Filter:
        return filter(e);
      case Expr::Kind::Test: {
        const bool result = test(e);
        return Value::boolean(e.negated ? !result : result);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.kind == Value::Kind::Int) return Value::integer(e.name == "-" ? -v.i : v.i);
        if (v.kind == Value::Kind::Float) return Value::real(e.name == "-" ? -v.f : v.f);
        error(fmt::format("unary {} of a {}", e.name, v.type_name()), e.pos);
      }
      case Expr::Kind::Binary:
        return binary(e);
      case Expr::Kind::Conditional:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      case Expr::Kind::List: {
        Array items;
        for (const auto& x : e.args) items.push_back(eval(*x));
        return Value::list(std::move(items));
      }
      case Expr::Kind::Dict: {
        Value d = Value::dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2)
          d.set(to_output(eval(*e.args[k])), eval(*e.args[k + 1]));
        return d;
      }
    }
    return Value();
  }

  Value index(const Value& target, const Value& key, size_t pos) const {
    if (target.kind == Value::Kind::Object) return target.get(to_output(key));
    if (key.kind != Value::Kind::Int) {
      if (target.is_undefined()) return Value();
      error(fmt::format("index of a {} by a {}", target.type_name(), key.type_name()), pos);
    }
    if (target.kind == Value::Kind::Array) {
      int64_t k = key.i < 0 ? key.i + static_cast<int64_t>(target.array->size()) : key.i;
      if (k < 0 || k >= static_cast<int64_t>(target.array->size())) return Value();
      return (*target.array)[static_cast<size_t>(k)];
    }
    if (target.kind == Value::Kind::String) {
      const auto chars = code_points(target.s);
      int64_t k = key.i < 0 ? key.i + static_cast<int64_t>(chars.size()) : key.i;
      if (k < 0 || k >= static_cast<int64_t>(chars.size())) return Value();
      return Value::string(chars[static_cast<size_t>(k)]);
    }
    return Value();
  }

  Value slice(const Expr& e) {
    const Value target = eval(*e.args[0]);
    const auto bound = [&](int i) -> std::optional<int64_t> {
      if (!e.args[static_cast<size_t>(i)]) return std::nullopt;
      const Value v = eval(*e.args[static_cast<size_t>(i)]);
      if (v.kind == Value::Kind::None) return std::nullopt;
      if (v.kind != Value::Kind::Int) error("slice bounds must be integers", e.pos);
      return v.i;
    };
    const std::optional<int64_t> start = bound(1), stop = bound(2), step_opt = bound(3);
    const int64_t step = step_opt.value_or(1);
    if (step == 0) error("slice step cannot be zero", e.pos);
    std::vector<Value> items;
    const bool is_string = target.kind == Value::Kind::String;
    if (is_string) {
      for (auto& c : code_points(target.s)) items.push_back(Value::string(c));
    } else if (target.kind == Value::Kind::Array) {
      items = *target.array;
    } else {
      error(fmt::format("cannot slice a {}", target.type_name()), e.pos);
    }
    const auto n = static_cast<int64_t>(items.size());
    // Python's slice.indices()
    const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t lo = clamp(start, step > 0 ? 0 : n - 1), hi = clamp(stop, step > 0 ? n : -1);
    Array picked;
    for (int64_t k = lo; step > 0 ? k < hi : k > hi; k += step)
      picked.push_back(items[static_cast<size_t>(k)]);
    if (!is_string) return Value::list(std::move(picked));
    std::string s;
    for (const Value& c : picked) s += c.s;
    return Value::string(s);
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    auto [args, kwargs] = eval_args(e, 1);
    if (callee.kind == Expr::Kind::Attr) {
      Value target = eval(*callee.args[0]);
      const Value member = target.get(callee.name);
      if (member.kind == Value::Kind::Function) return (*member.function)(args, kwargs);
      return method(target, callee.name, args, kwargs, e.pos);
    }
    const Value fn = eval(callee);
    if (fn.kind != Value::Kind::Function)
      error(fmt::format("{} is a {}, not a function",
                        callee.kind == Expr::Kind::Name ? callee.name : "callee", fn.type_name()),
            e.pos);
    return (*fn.function)(args, kwargs);
  }

  Value method(Value& target, const std::string& name, std::vector<Value>& args, Kwargs& kwargs, size_t pos) {
    const Value* a0 = arg(args, kwargs, 0, "");
    if (target.kind == Value::Kind::String) {
      const std::string& s = target.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::string(strip(s, a0, name != "rstrip", name != "lstrip"));
      if (name == "upper" || name == "lower") return Value::string(ascii_case(s, name == "upper"));
      if (name == "title") return Value::string(title_case(s));
      if (name == "capitalize")
        return Value::string(s.empty() ? s
                                       : ascii_case(s.substr(0, 1), true) + ascii_case(s.substr(1), false));
      if (name == "startswith" || name == "endswith") {
        if (!a0) error(fmt::format("{}() needs an argument", name), pos);
        std::vector<Value> options = a0->kind == Value::Kind::Array ? *a0->array : std::vector<Value>{*a0};
        for (const Value& o : options) {
          const std::string& p = o.s;
          if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                   : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split") return split(s, a0, arg(args, kwargs, 1, "maxsplit"));
      if (name == "replace" && args.size() >= 2)
        return Value::string(replace(s, args[0].s, args[1].s, args.size() > 2 ? args[2].i : -1));
      if (name == "find" && a0) {
        const size_t at = s.find(a0->s);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(at));
      }
      if (name == "count" && a0) {
        int64_t n = 0;
        for (size_t at = s.find(a0->s); !a0->s.empty() && at != std::string::npos;
             at = s.find(a0->s, at + a0->s.size()))
          ++n;
        return Value::integer(n);
      }
      if (name == "join" && a0) {
        std::string out;
        const auto items = iterate(*a0, pos);
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += s;
          out += to_output(items[k]);
        }
        return Value::string(out);
      }
      if (name == "splitlines") {
        Array lines;
        size_t begin = 0;
        for (size_t k = 0; k <= s.size(); ++k)
          if (k == s.size() || s[k] == '\n') {
            if (k > begin || k < s.size()) lines.push_back(Value::string(s.substr(begin, k - begin)));
            begin = k + 1;
          }
        return Value::list(std::move(lines));
      }
    } else if (target.kind == Value::Kind::Object && !target.is_namespace) {
      if (name == "items") {
        Array items;
        for (const auto& [k, v] : *target.object) items.push_back(Value::list({Value::string(k), v}));
        return Value::list(std::move(items));
      }
      if (name == "keys" || name == "values") {
        Array items;
        for (const auto& [k, v] : *target.object) items.push_back(name == "keys" ? Value::string(k) : v);
        return Value::list(std::move(items));
      }
      if (name == "get") {
        const Value v = a0 ? target.get(to_output(*a0)) : Value();
        return !v.is_undefined() ? v : args.size() > 1 ? args[1] : Value::none();
      }
    } else if (target.kind == Value::Kind::Array) {
      if (name == "append" && a0) {
        target.array->push_back(*a0);
        return Value::none();
      }
      if (name == "index" && a0) {
        for (size_t k = 0; k < target.array->size(); ++k)
          if (equal((*target.array)[k], *a0)) return Value::integer(static_cast<int64_t>(k));
        error("list.index(): value is not in the list", pos);
      }
    }
    error(fmt::format("method {}() of a {} is not supported", name, target.type_name()), pos);
  }

  static std::string replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t last = 0;
    for (size_t at = s.find(from); at != std::string::npos && count != 0; at = s.find(from, last), --count) {
      out.append(s, last, at - last);
      out += to;
      last = at + from.size();
    }
    out.append(s, last);
    return out;
  }

  static Value split(const std::string& s, const Value* sep, const Value* maxsplit_v) {
    int64_t maxsplit = maxsplit_v && maxsplit_v->kind == Value::Kind::Int ? maxsplit_v->i : -1;
    Array parts;
    if (!sep || sep->kind == Value::Kind::None) {  // runs of whitespace, ends ignored
      size_t k = 0;
      while (k < s.size()) {
        while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
        if (k >= s.size()) break;
        if (maxsplit == 0) {
          parts.push_back(Value::string(strip(s.substr(k), nullptr, false, true)));
          break;
        }
        size_t end = k;
        while (end < s.size() && !std::isspace(static_cast<unsigned char>(s[end]))) ++end;
        parts.push_back(Value::string(s.substr(k, end - k)));
        k = end;
        --maxsplit;
      }
      return Value::list(std::move(parts));
    }
    const std::string& d = sep->s;
    size_t last = 0;
    for (size_t at = s.find(d); !d.empty() && at != std::string::npos && maxsplit != 0;
         at = s.find(d, last), --maxsplit) {
      parts.push_back(Value::string(s.substr(last, at - last)));
      last = at + d.size();
    }
    parts.push_back(Value::string(s.substr(last)));
    return Value::list(std::move(parts));
  }

  static int64_t length_of(const Value& v) {
    switch (v.kind) {
      case Value::Kind::String:
        return static_cast<int64_t>(code_points(v.s).size());
      case Value::Kind::Array:
        return static_cast<int64_t>(v.array->size());
      case Value::Kind::Object:
        return static_cast<int64_t>(v.object->size());
      default:
        return 0;
    }
  }

  // Applies a filter or test by name to each item (select/reject/map with a filter name).
  bool run_test(const std::string& name, const Value& v, std::vector<Value>& args, size_t pos) {
    const Value* a0 = args.empty() ? nullptr : &args[0];
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == Value::Kind::None;
    if (name == "string") return v.kind == Value::Kind::String;
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Value::Kind::Int;
    if (name == "float") return v.kind == Value::Kind::Float;
    if (name == "boolean") return v.kind == Value::Kind::Bool;
    if (name == "true") return v.kind == Value::Kind::Bool && v.b;
    if (name == "false") return v.kind == Value::Kind::Bool && !v.b;
    if (name == "mapping") return v.kind == Value::Kind::Object;
    if (name == "sequence" || name == "iterable")
      return v.kind == Value::Kind::Array || v.kind == Value::Kind::String || v.kind == Value::Kind::Object;
    if (name == "callable") return v.kind == Value::Kind::Function;
    if (name == "odd" || name == "even")
      return v.kind == Value::Kind::Int && (v.i % 2 != 0) == (name == "odd");
    if (name == "divisibleby" && a0) return v.kind == Value::Kind::Int && a0->i != 0 && v.i % a0->i == 0;
    if (name == "lower" || name == "upper")
      return v.kind == Value::Kind::String && ascii_case(v.s, name == "upper") == v.s;
    if ((name == "eq" || name == "equalto") && a0) return equal(v, *a0);
    if (name == "ne" && a0) return !equal(v, *a0);
    if ((name == "lt" || name == "gt" || name == "le" || name == "ge") && a0) {
      const int c = compare(v, *a0, pos);
      return name == "lt" ? c < 0 : name == "gt" ? c > 0 : name == "le" ? c <= 0 : c >= 0;
    }
    if (name == "in" && a0) return contains(*a0, v, pos);
    error(fmt::format("test '{}' is not supported (supported: {})", name, kTests), pos);
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    auto [args, kwargs] = eval_args(e, 1);
    return run_test(e.name, v, args, e.pos);
  }

  Value filter(const Expr& e) {
    Value v = eval(*e.args[0]);
    auto [args, kwargs] = eval_args(e, 1);
    return apply_filter(e.name, v, args, kwargs, e.pos);
  }

  Value apply_filter(const std::string& name, const Value& v, std::vector<Value>& args, Kwargs& kwargs,
                     size_t pos) {
    const Value* a0 = arg(args, kwargs, 0, "");
    if (name == "trim") return Value::string(strip(to_output(v), a0, true, true));
    if (name == "length" || name == "count") return Value::integer(length_of(v));
    if (name == "tojson") {
      const Value* indent = arg(args, kwargs, 0, "indent");
      return Value::string(
          to_json(v, indent && indent->kind == Value::Kind::Int ? static_cast<int>(indent->i) : 0));
    }
    if (name == "upper" || name == "lower") return Value::string(ascii_case(to_output(v), name == "upper"));
    if (name == "title") return Value::string(title_case(to_output(v)));
    if (name == "capitalize") {
      const std::string s = to_output(v);
      return Value::string(s.empty() ? s : ascii_case(s.substr(0, 1), true) + ascii_case(s.substr(1), false));
    }
    if (name == "default" || name == "d") {
      const Value* boolean = arg(args, kwargs, 1, "boolean");
      const bool use_default = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      return use_default ? (a0 ? *arg(args, kwargs, 0, "default_value") : Value::string("")) : v;
    }
    if (name == "items") {
      Value target = v;
      std::vector<Value> none;
      Kwargs none_kw;
      if (v.kind != Value::Kind::Object) error(fmt::format("items of a {}", v.type_name()), pos);
      return method(target, "items", none, none_kw, pos);
    }
    if (name == "first" || name == "last") {
      const auto items = iterate(v, pos);
      if (items.empty()) return Value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      const std::string sep = a0 ? to_output(*a0) : "";
      const Value* attribute = arg(args, kwargs, 1, "attribute");
      std::string out;
      const auto items = iterate(v, pos);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += sep;
        out += to_output(attribute ? items[k].get(to_output(*attribute)) : items[k]);
      }
      return Value::string(out);
    }
    if (name == "list") return Value::list(iterate(v, pos));
    if (name == "string") return Value::string(to_output(v));
    if (name == "safe") return v;
    if (name == "int") {
      if (v.kind == Value::Kind::Float) return Value::integer(static_cast<int64_t>(v.f));
      if (v.kind == Value::Kind::String) {
        try {
          return Value::integer(std::stoll(v.s));
        } catch (...) {
          return Value::integer(0);
        }
      }
      return Value::integer(v.kind == Value::Kind::Int ? v.i : 0);
    }
    if (name == "float") {
      if (v.is_number()) return Value::real(v.number());
      try {
        return Value::real(v.kind == Value::Kind::String ? std::stod(v.s) : 0.0);
      } catch (...) {
        return Value::real(0.0);
      }
    }
    if (name == "abs")
      return v.kind == Value::Kind::Int ? Value::integer(std::llabs(v.i))
                                        : Value::real(std::fabs(v.number()));
    if (name == "replace" && args.size() >= 2)
      return Value::string(replace(to_output(v), to_output(args[0]), to_output(args[1]), -1));
    if (name == "reverse") {
      if (v.kind == Value::Kind::String) {
        auto chars = code_points(v.s);
        std::reverse(chars.begin(), chars.end());
        std::string s;
        for (auto& c : chars) s += c;
        return Value::string(s);
      }
      auto items = iterate(v, pos);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "unique") {
      Array out;
      for (const Value& x : iterate(v, pos))
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); }))
          out.push_back(x);
      return Value::list(std::move(out));
    }
    if (name == "sort") {
      auto items = iterate(v, pos);
      const Value* attribute = arg(args, kwargs, 99, "attribute");
      const Value* reverse = arg(args, kwargs, 0, "reverse");
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const Value& a = attribute ? x.get(to_output(*attribute)) : x;
        const Value& b = attribute ? y.get(to_output(*attribute)) : y;
        return compare(a, b, pos) < 0;
      });
      if (reverse && reverse->truthy()) std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool by_attr = name.find("attr") != std::string::npos;
      const bool keep_if = name.rfind("select", 0) == 0;
      Array out;
      for (const Value& item : iterate(v, pos)) {
        const Value subject = by_attr ? item.get(args.empty() ? "" : to_output(args[0])) : item;
        const size_t first_test_arg = by_attr ? 1 : 0;
        bool passed;
        if (args.size() > first_test_arg) {
          std::vector<Value> test_args(args.begin() + static_cast<long>(first_test_arg) + 1, args.end());
          passed = run_test(to_output(args[first_test_arg]), subject, test_args, pos);
        } else {
          passed = subject.truthy();
        }
        if (passed == keep_if) out.push_back(item);
      }
      return Value::list(std::move(out));
    }
    if (name == "map") {
      Array out;
      const Value* attribute = arg(args, kwargs, 99, "attribute");
      for (const Value& item : iterate(v, pos)) {
        if (attribute) {
          out.push_back(item.get(to_output(*attribute)));
        } else if (!args.empty()) {
          std::vector<Value> rest(args.begin() + 1, args.end());
          Kwargs none;
          Value copy = item;
          out.push_back(apply_filter(to_output(args[0]), copy, rest, none, pos));
        }
      }
      return Value::list(std::move(out));
    }
    error(fmt::format("filter '{}' is not supported (supported: {})", name, kFilters), pos);
  }

  int compare(const Value& a, const Value& b, size_t pos) const {
    if (a.is_number() && b.is_number()) return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    if (a.kind == Value::Kind::String && b.kind == Value::Kind::String)
      return a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
    error(fmt::format("cannot order a {} and a {}", a.type_name(), b.type_name()), pos);
  }

  bool contains(const Value& haystack, const Value& needle, size_t pos) const {
    switch (haystack.kind) {
      case Value::Kind::String:
        if (needle.kind != Value::Kind::String)
          error(fmt::format("'in <string>' needs a string, not a {}", needle.type_name()), pos);
        return haystack.s.find(needle.s) != std::string::npos;
      case Value::Kind::Array:
        return std::any_of(haystack.array->begin(), haystack.array->end(),
                           [&](const Value& x) { return equal(x, needle); });
      case Value::Kind::Object:
        return !haystack.get(to_output(needle)).is_undefined();
      case Value::Kind::Undefined:
      case Value::Kind::None:
        return false;
      default:
        error(fmt::format("'in' of a {}", haystack.type_name()), pos);
    }
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value left = eval(*e.args[0]);
      return left.truthy() ? eval(*e.args[1]) : left;
    }
    if (op == "or") {
      Value left = eval(*e.args[0]);
      return left.truthy() ? left : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "<") return Value::boolean(compare(a, b, e.pos) < 0);
    if (op == "<=") return Value::boolean(compare(a, b, e.pos) <= 0);
    if (op == ">") return Value::boolean(compare(a, b, e.pos) > 0);
    if (op == ">=") return Value::boolean(compare(a, b, e.pos) >= 0);
    if (op == "in") return Value::boolean(contains(b, a, e.pos));
    if (op == "not in") return Value::boolean(!contains(b, a, e.pos));
    if (op == "~") return Value::string(to_output(a) + to_output(b));
    if (op == "+") {
      if (a.kind == Value::Kind::String && b.kind == Value::Kind::String) return Value::string(a.s + b.s);
      if (a.kind == Value::Kind::Array && b.kind == Value::Kind::Array) {
        Array items = *a.array;
        items.insert(items.end(), b.array->begin(), b.array->end());
        return Value::list(std::move(items));
      }
    }
    if (op == "*" && a.kind == Value::Kind::String && b.kind == Value::Kind::Int) {
      std::string out;
      for (int64_t k = 0; k < b.i; ++k) out += a.s;
      return Value::string(out);
    }
    if (!a.is_number() || !b.is_number())
      error(fmt::format("operator {} on a {} and a {}", op, a.type_name(), b.type_name()), e.pos);
    const bool ints = a.kind == Value::Kind::Int && b.kind == Value::Kind::Int;
    if (op == "+") return ints ? Value::integer(a.i + b.i) : Value::real(a.number() + b.number());
    if (op == "-") return ints ? Value::integer(a.i - b.i) : Value::real(a.number() - b.number());
    if (op == "*") return ints ? Value::integer(a.i * b.i) : Value::real(a.number() * b.number());
    if (op == "/") {
      if (b.number() == 0) error("division by zero", e.pos);
      return Value::real(a.number() / b.number());
    }
    if (op == "//" || op == "%") {
      if (b.number() == 0) error("division by zero", e.pos);
      if (ints) {
        int64_t q = a.i / b.i, r = a.i % b.i;
        if (r != 0 && ((r < 0) != (b.i < 0))) {
          --q;
          r += b.i;
        }
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(a.number() / b.number());
      return Value::real(op == "//" ? q : a.number() - q * b.number());
    }
    if (op == "**")
      return ints && b.i >= 0 ? Value::integer(static_cast<int64_t>(std::pow(a.i, b.i)))
                              : Value::real(std::pow(a.number(), b.number()));
    error(fmt::format("operator {} is not supported", op), e.pos);
  }

  const std::string& src_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
};

}  // namespace jinja

struct ChatTemplate::Impl {
  std::string source;
  jinja::Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->body = jinja::parse_template(impl_->source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::json& context) const {
  jinja::Renderer renderer(impl_->source, context);
  return renderer.render(impl_->body);
}

std::string apply_chat_template(const Tokenizer& tokenizer, const nlohmann::json& messages,
                                bool add_generation_prompt, const nlohmann::json& extra) {
  EXPAR_CHECK(
      !tokenizer.chat_template().empty(),
      "the tokenizer has no chat template (tokenizer_config.json has no chat_template and there is no "
      "chat_template.jinja): format the prompt yourself");
  nlohmann::json context = extra.is_object() ? extra : nlohmann::json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = tokenizer.bos_token().value_or("");
  context["eos_token"] = tokenizer.eos_token().value_or("");
  return ChatTemplate(tokenizer.chat_template()).render(context);
}

}  // namespace expar
