#pragma once
// The parsed form of a chat template: expressions and statements with their byte offset in the template,
// so that errors can name the line and column.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "expar/io/chat_template/value.hpp"

namespace expar::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,
    Name,
    Attr,
    Index,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Conditional,
    List,
    Dict
  };
  Kind kind = Kind::Literal;
  size_t pos = 0;
  Value literal;                                        // Literal
  std::string name;                                     // Name, Attr, Filter, Test, operator of Unary/Binary
  std::vector<ExprPtr> args;                            // operands, call/filter/test arguments, items
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // keyword arguments
  bool negated = false;                                 // `is not`
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue };
  Kind kind = Kind::Text;
  size_t pos = 0;
  std::string text;                                     // Text; Set/SetBlock/Macro target name
  std::string attr;                                     // Set: `ns.attr`
  ExprPtr expr;                                         // Output, Set value, For iterable
  ExprPtr filter;                                       // For: `for x in xs if cond`
  std::vector<std::string> vars;                        // For loop variables
  std::vector<std::pair<ExprPtr, Body>> branches;       // If: (condition, body) for if and each elif
  Body body, else_body;                                 // For/SetBlock/Macro body; If/For else
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters and defaults
};

// Parses a template; throws expar::Error naming the construct and its line:column when it is not supported.
Body parse_template(const std::string& source);

// "line L, column C" of a byte offset in `source`.
std::string position_of(const std::string& source, size_t pos);

}  // namespace expar::jinja
