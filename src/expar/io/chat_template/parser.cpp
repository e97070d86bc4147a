// Lexer and recursive-descent parser of the Jinja subset that chat templates use. Whitespace is handled as
// transformers (and @huggingface/jinja) configure Jinja: one trailing newline of the template is dropped,
// lstrip_blocks and trim_blocks are on, and `{%-` / `-%}` (also for `{{ }}` and `{# #}`) strip whitespace.
#include <cctype>

#include "expar/core/error.hpp"
#include "expar/io/chat_template/ast.hpp"

namespace expar::jinja {

std::string position_of(const std::string& source, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t k = 0; k < pos && k < source.size(); ++k) {
    if (source[k] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

namespace {

struct Token {
  enum class Kind { Text, ExprOpen, ExprClose, StmtOpen, StmtClose, Name, Int, Float, String, Op, End };
  Kind kind;
  std::string text;
  size_t pos;
  int64_t i = 0;
  double f = 0;
};

NodePtr new_node(Node::Kind kind, size_t pos) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

ExprPtr new_expr(Expr::Kind kind, size_t pos) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    size_t at = 0;
    bool strip_next = false;  // the previous tag ended with `-`
    while (at < src_.size()) {
      size_t open = find_open(at);
      std::string text = src_.substr(at, open - at);
      if (strip_next) text.erase(0, leading_space(text));
      strip_next = false;
      if (open < src_.size()) {
        const char kind = src_[open + 1];
        const bool minus = open + 2 < src_.size() && src_[open + 2] == '-';
        if (minus) {
          text.erase(text.size() - trailing_space(text));
        } else if (kind != '{') {
          strip_line_indent(text, at);  // lstrip_blocks
        }
      }
      if (!text.empty()) tokens_.push_back({Token::Kind::Text, text, at});
      if (open >= src_.size()) break;
      at = lex_tag(open, strip_next);
    }
    tokens_.push_back({Token::Kind::End, "", src_.size()});
    return tokens_;
  }

  const std::string& source() const { return src_; }

 private:
  size_t find_open(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }
  static size_t leading_space(const std::string& s) {
    size_t n = 0;
    while (n < s.size() && is_space(s[n])) ++n;
    return n;
  }
  static size_t trailing_space(const std::string& s) {
    size_t n = 0;
    while (n < s.size() && is_space(s[s.size() - 1 - n])) ++n;
    return n;
  }
  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go.
  void strip_line_indent(std::string& text, size_t text_start) const {
    size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
    if (k == 0 ? (text_start == 0 || src_[text_start - 1] == '\n') : text[k - 1] == '\n') text.erase(k);
  }

  size_t lex_tag(size_t open, bool& strip_next) {
    const char kind = src_[open + 1];
    size_t at = open + 2;
    if (at < src_.size() && (src_[at] == '-' || src_[at] == '+')) ++at;
    if (kind == '#') {
      const size_t close = src_.find("#}", at);
      EXPAR_CHECK(close != std::string::npos, "chat template: comment opened at {} is not closed with #}}",
                  position_of(src_, open));
      strip_next = close > 0 && src_[close - 1] == '-';
      return trim_block_newline(close + 2);
    }
    tokens_.push_back({kind == '{' ? Token::Kind::ExprOpen : Token::Kind::StmtOpen, "", open});
    const std::string closer = kind == '{' ? "}}" : "%}";
    while (true) {
      while (at < src_.size() && is_space(src_[at])) ++at;
      EXPAR_CHECK(at < src_.size(), "chat template: tag opened at {} is not closed with {}",
                  position_of(src_, open), closer);
      if ((src_[at] == '-' || src_[at] == '+') && src_.compare(at + 1, 2, closer) == 0) {
        strip_next = src_[at] == '-';
        ++at;
      }
      if (src_.compare(at, 2, closer) == 0) {
        tokens_.push_back({kind == '{' ? Token::Kind::ExprClose : Token::Kind::StmtClose, "", at});
        return kind == '{' ? at + 2 : trim_block_newline(at + 2);
      }
      at = lex_one(at);
    }
  }
  size_t trim_block_newline(size_t at) const { return at < src_.size() && src_[at] == '\n' ? at + 1 : at; }

  size_t lex_one(size_t at) {
    const char c = src_[at];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = at;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
        ++end;
      tokens_.push_back({Token::Kind::Name, src_.substr(at, end - at), at});
      return end;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = at;
      while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      bool is_float = false;
      if (end + 1 < src_.size() && src_[end] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
        is_float = true;
        ++end;
        while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      }
      Token t{is_float ? Token::Kind::Float : Token::Kind::Int, src_.substr(at, end - at), at};
      if (is_float)
        t.f = std::stod(t.text);
      else
        t.i = std::stoll(t.text);
      tokens_.push_back(t);
      return end;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      size_t k = at + 1;
      for (; k < src_.size() && src_[k] != c; ++k) {
        if (src_[k] != '\\' || k + 1 >= src_.size()) {
          value.push_back(src_[k]);
          continue;
        }
        const char e = src_[++k];
        value.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? '\0' : e);
        if (e != 'n' && e != 't' && e != 'r' && e != '0' && e != '\\' && e != '\'' && e != '"') {
          value.back() = '\\';
          value.push_back(e);
        }
      }
      EXPAR_CHECK(k < src_.size(), "chat template: string opened at {} is not closed", position_of(src_, at));
      tokens_.push_back({Token::Kind::String, value, at});
      return k + 1;
    }
    static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%",
                                 "~",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}", "="};
    for (const char* op : kOps)
      if (src_.compare(at, std::char_traits<char>::length(op), op) == 0) {
        tokens_.push_back({Token::Kind::Op, op, at});
        return at + std::char_traits<char>::length(op);
      }
    fail("chat template: unexpected character {:?} at {}", std::string(1, c), position_of(src_, at));
  }

  std::string src_;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& source) : t_(std::move(tokens)), src_(source) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(k_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(k_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Name && peek(ahead).text == name;
  }
  [[noreturn]] void error(const std::string& what, size_t pos) const {
    fail("chat template: {} at {}", what, position_of(src_, pos));
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(fmt::format("expected '{}' but found {:?}", op, peek().text), peek().pos);
    ++k_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::Name)
      error(fmt::format("expected a name but found {:?}", peek().text), peek().pos);
    return next().text;
  }
  void expect_close() {
    if (peek().kind != Token::Kind::StmtClose)
      error(fmt::format("expected %}} but found {:?}", peek().text), peek().pos);
    ++k_;
  }

  // Statements until one of `ends` (its keyword is stored in `end`, the tag left open after the keyword).
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.kind == Token::Kind::End) {
        if (!ends.empty())
          error(fmt::format("template ends inside a block: expected {{% {} %}}", ends[0]), tok.pos);
        return body;
      }
      if (tok.kind == Token::Kind::Text) {
        auto n = new_node(Node::Kind::Text, tok.pos);
        n->text = tok.text;
        body.push_back(n);
        ++k_;
        continue;
      }
      if (tok.kind == Token::Kind::ExprOpen) {
        ++k_;
        auto n = new_node(Node::Kind::Output, tok.pos);
        n->expr = parse_expr();
        if (peek().kind != Token::Kind::ExprClose)
          error(fmt::format("expected }}}} but found {:?}", peek().text), peek().pos);
        ++k_;
        body.push_back(n);
        continue;
      }
      // StmtOpen
      const size_t pos = tok.pos;
      ++k_;
      const std::string keyword = peek().kind == Token::Kind::Name ? peek().text : "";
      for (const auto& e : ends)
        if (keyword == e) {
          ++k_;
          end = keyword;
          return body;
        }
      ++k_;
      if (keyword == "if") {
        body.push_back(parse_if(pos));
      } else if (keyword == "for") {
        body.push_back(parse_for(pos));
      } else if (keyword == "set") {
        body.push_back(parse_set(pos));
      } else if (keyword == "macro") {
        body.push_back(parse_macro(pos));
      } else if (keyword == "break" || keyword == "continue") {
        expect_close();
        body.push_back(new_node(keyword == "break" ? Node::Kind::Break : Node::Kind::Continue, pos));
      } else if (keyword == "generation" || keyword == "endgeneration") {
        expect_close();  // transformers' marker of assistant text: no output of its own
      } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
        error(fmt::format("{{% {} %}} has no open block to belong to", keyword), pos);
      } else {
        error(fmt::format(
                  "statement {{% {} %}} is not supported (supported: if, elif, else, for, set, macro, break, "
                  "continue, generation)",
                  keyword.empty() ? std::string("?") : keyword),
              pos);
      }
    }
  }

  NodePtr parse_if(size_t pos) {
    auto n = new_node(Node::Kind::If, pos);
    ExprPtr cond = parse_expr();
    expect_close();
    while (true) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end);
      n->branches.emplace_back(cond, std::move(body));
      if (end == "elif") {
        cond = parse_expr();
        expect_close();
        continue;
      }
      if (end == "else") {
        expect_close();
        std::string end2;
        n->else_body = parse_body({"endif"}, end2);
      }
      expect_close();
      return n;
    }
  }

  NodePtr parse_for(size_t pos) {
    auto n = new_node(Node::Kind::For, pos);
    n->vars.push_back(expect_name());
    while (is_op(",")) {
      ++k_;
      n->vars.push_back(expect_name());
    }
    if (!is_name("in")) error("expected 'in' in a for loop", peek().pos);
    ++k_;
    n->expr = parse_or_expr();  // not a conditional: `for x in xs if cond` filters
    if (is_name("if")) {
      ++k_;
      n->filter = parse_or_expr();
    }
    if (is_name("recursive")) error("recursive for loops are not supported", peek().pos);
    expect_close();
    std::string end;
    n->body = parse_body({"else", "endfor"}, end);
    if (end == "else") {
      expect_close();
      n->else_body = parse_body({"endfor"}, end);
    }
    expect_close();
    return n;
  }

  NodePtr parse_set(size_t pos) {
    auto n = new_node(Node::Kind::Set, pos);
    n->text = expect_name();
    if (is_op(".")) {
      ++k_;
      n->attr = expect_name();
    }
    if (is_op(",")) error("tuple assignment in set is not supported", peek().pos);
    if (peek().kind == Token::Kind::StmtClose) {  // {% set x %}...{% endset %}
      ++k_;
      n->kind = Node::Kind::SetBlock;
      std::string end;
      n->body = parse_body({"endset"}, end);
      expect_close();
      return n;
    }
    expect_op("=");
    n->expr = parse_expr();
    expect_close();
    return n;
  }

  NodePtr parse_macro(size_t pos) {
    auto n = new_node(Node::Kind::Macro, pos);
    n->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      std::string param = expect_name();
      ExprPtr fallback;
      if (is_op("=")) {
        ++k_;
        fallback = parse_expr();
      }
      n->params.emplace_back(param, fallback);
      if (!is_op(")")) expect_op(",");
    }
    ++k_;
    expect_close();
    std::string end;
    n->body = parse_body({"endmacro"}, end);
    expect_close();
    return n;
  }

  ExprPtr make(Expr::Kind kind, size_t pos, std::string name = "", std::vector<ExprPtr> args = {}) {
    auto e = new_expr(kind, pos);
    e->name = std::move(name);
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_expr() {
    ExprPtr value = parse_or_expr();
    if (is_name("if")) {
      const size_t pos = next().pos;
      ExprPtr cond = parse_or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++k_;
        otherwise = parse_expr();
      }
      return make(Expr::Kind::Conditional, pos, "", {cond, value, otherwise});
    }
    return value;
  }
  ExprPtr parse_or_expr() {
    ExprPtr left = parse_and_expr();
    while (is_name("or")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::Binary, pos, "or", {left, parse_and_expr()});
    }
    return left;
  }
  ExprPtr parse_and_expr() {
    ExprPtr left = parse_not_expr();
    while (is_name("and")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::Binary, pos, "and", {left, parse_not_expr()});
    }
    return left;
  }
  ExprPtr parse_not_expr() {
    if (is_name("not")) {
      const size_t pos = next().pos;
      return make(Expr::Kind::Unary, pos, "not", {parse_not_expr()});
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr left = parse_concat();
    while (true) {
      const size_t pos = peek().pos;
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++k_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        k_ += 2;
        op = "not in";
      } else {
        return left;
      }
      left = make(Expr::Kind::Binary, pos, op, {left, parse_concat()});
    }
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_add();
    while (is_op("~")) {
      const size_t pos = next().pos;
      left = make(Expr::Kind::Binary, pos, "~", {left, parse_add()});
    }
    return left;
  }
  ExprPtr parse_add() {
    ExprPtr left = parse_mul();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = make(Expr::Kind::Binary, op.pos, op.text, {left, parse_mul()});
    }
    return left;
  }
  ExprPtr parse_mul() {
    ExprPtr left = parse_unary();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = make(Expr::Kind::Binary, op.pos, op.text, {left, parse_unary()});
    }
    return left;
  }
  ExprPtr parse_unary() {
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      return make(Expr::Kind::Unary, op.pos, op.text, {parse_unary()});
    }
    ExprPtr e = parse_postfix(parse_primary());
    if (is_op("**")) {
      const size_t pos = next().pos;
      e = make(Expr::Kind::Binary, pos, "**", {e, parse_unary()});
    }
    return e;
  }

  void parse_call_args(ExprPtr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::Name && is_op("=", 1)) {
        std::string key = next().text;
        ++k_;
        call->kwargs.emplace_back(key, parse_expr());
      } else {
        call->args.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
    ++k_;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const size_t pos = peek().pos;
      if (is_op(".")) {
        ++k_;
        e = make(Expr::Kind::Attr, pos, expect_name(), {e});
      } else if (is_op("[")) {
        ++k_;
        e = parse_subscript(e, pos);
      } else if (is_op("(")) {
        ExprPtr call = make(Expr::Kind::Call, pos, "", {e});
        parse_call_args(call);
        e = call;
      } else if (is_op("|")) {
        ++k_;
        ExprPtr f = make(Expr::Kind::Filter, pos, expect_name(), {e});
        if (is_op("(")) parse_call_args(f);
        e = f;
      } else if (is_name("is")) {
        ++k_;
        ExprPtr test = make(Expr::Kind::Test, pos, "", {e});
        if (is_name("not")) {
          ++k_;
          test->negated = true;
        }
        // `none`, `true` and `false` are names of tests too
        test->name = expect_name();
        if (is_op("(")) {
          parse_call_args(test);
        } else if (peek().kind == Token::Kind::String || peek().kind == Token::Kind::Int ||
                   (peek().kind == Token::Kind::Name && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if") && !is_name("is") && !is_name("in") &&
                    !is_name("not"))) {
          test->args.push_back(parse_primary());  // `x is divisibleby 3`, `x is sameas y`
        }
        e = test;
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, size_t pos) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        ++k_;
        slice = true;
        if (++part > 2) error("a slice has at most start:stop:step", pos);
        continue;
      }
      parts[part] = parse_expr();
    }
    ++k_;
    if (!slice) {
      if (!parts[0]) error("empty subscript []", pos);
      return make(Expr::Kind::Index, pos, "", {target, parts[0]});
    }
    return make(Expr::Kind::Slice, pos, "", {target, parts[0], parts[1], parts[2]});
  }

  ExprPtr parse_primary() {
    const Token& tok = next();
    auto literal = [&](Value v) {
      ExprPtr e = make(Expr::Kind::Literal, tok.pos);
      e->literal = std::move(v);
      return e;
    };
    switch (tok.kind) {
      case Token::Kind::Int:
        return literal(Value::integer(tok.i));
      case Token::Kind::Float:
        return literal(Value::real(tok.f));
      case Token::Kind::String: {
        std::string s = tok.text;
        while (peek().kind == Token::Kind::String) s += next().text;  // adjacent literals concatenate
        return literal(Value::string(s));
      }
      case Token::Kind::Name:
        if (tok.text == "true" || tok.text == "True") return literal(Value::boolean(true));
        if (tok.text == "false" || tok.text == "False") return literal(Value::boolean(false));
        if (tok.text == "none" || tok.text == "None") return literal(Value::none());
        return make(Expr::Kind::Name, tok.pos, tok.text);
      case Token::Kind::Op:
        if (tok.text == "(") {
          ExprPtr e = parse_expr();
          if (is_op(",")) {  // a tuple: evaluated as a list
            std::vector<ExprPtr> items{e};
            while (is_op(",")) {
              ++k_;
              if (is_op(")")) break;
              items.push_back(parse_expr());
            }
            e = make(Expr::Kind::List, tok.pos, "", std::move(items));
          }
          expect_op(")");
          return e;
        }
        if (tok.text == "[") {
          ExprPtr e = make(Expr::Kind::List, tok.pos);
          while (!is_op("]")) {
            e->args.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          ++k_;
          return e;
        }
        if (tok.text == "{") {
          ExprPtr e = make(Expr::Kind::Dict, tok.pos);
          while (!is_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          ++k_;
          return e;
        }
        break;
      default:
        break;
    }
    error(fmt::format("unexpected {:?} in an expression",
                      tok.text.empty() ? std::string("end of tag") : tok.text),
          tok.pos);
  }

  std::vector<Token> t_;
  const std::string& src_;
  size_t k_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  Lexer lexer(source);
  std::vector<Token> tokens = lexer.run();
  Parser parser(std::move(tokens), source);
  return parser.parse_all();
}

}  // namespace expar::jinja
