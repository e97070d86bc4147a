// Unit tests of the chat-template Jinja subset: each construct renders what Jinja renders, and unsupported
// constructs are errors naming the construct and its position.
#include "expar/io/chat_template.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expar/core/error.hpp"

namespace expar {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string render(const std::string& source, const json& context = json::object()) {
  return ChatTemplate(source).render(context);
}

std::string error_of(const std::string& source, const json& context = json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplate, LoopsAndConditionals) {
  const json ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if loop.first %}F{% elif loop.last %}L{% else "
                   "%}-{% endif %}{% endfor %}",
                   ctx),
            "1aF2b-3cL");
  EXPECT_EQ(
      render("{% for x in xs if x != 'b' %}{{ loop.index0 }}/{{ loop.length }}{{ x }} {% endfor %}", ctx),
      "0/2a 1/2c ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", ctx), "a");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
}

TEST(ChatTemplate, ScopingAndNamespace) {
  // A plain set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(3) %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor "
                   "%}{{ ns.x }}"),
            "4");
}

TEST(ChatTemplate, ExpressionsFiltersTestsAndMethods) {
  EXPECT_EQ(render("{{ '  hi  ' | trim }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ [1, 2, 3] | length }}"),
            "hi|ABab|3");
  EXPECT_EQ(
      render("{{ x | default('d') }}{{ none is none }}{{ 'a' is string }}{{ y is defined }}", {{"y", 1}}),
      "dTrueTrueTrue");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}|{{ 7 // 2 }}{{ -7 // 2 }}{{ 7 % 3 }}{{ 2 ** 3 }}{{ 1 / 2 }}"),
            "a1None|3-4180.5");
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }}{{ 'abc'[::-1] }}{{ [1, 2, 3][-1] }}{{ [1, 2, 3][:2] }}"),
            "bcdcba3[1, 2]");
  EXPECT_EQ(render("{{ 'a</think>b'.split('</think>')[-1] }}{{ '\\n\\nx\\n'.strip('\\n') }}{{ "
                   "'abc'.startswith('ab') }}"),
            "bxTrue");
  EXPECT_EQ(render("{{ 'b' in 'abc' }}{{ 2 not in [1, 2] }}{{ x is not none }}{{ 'yes' if 1 > 2 else 'no' }}",
                   {{"x", 0}}),
            "TrueFalseTrueno");
  EXPECT_EQ(render("{{ {'a': [1, 'x', none, true], 'b': 1.5} | tojson }}"),
            R"({"a": [1, "x", null, true], "b": 1.5})");
  EXPECT_EQ(render("{{ ['b', 'a'] | join(', ') }}|{{ [1, 2] | first }}{{ [1, 2] | last }}"), "b, a|12");
}

TEST(ChatTemplate, WhitespaceControlAndBlocks) {
  // trim_blocks and lstrip_blocks (as transformers configures Jinja), and -%} / {%-.
  EXPECT_EQ(render("a\n  {% if true %}\nb\n  {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(render("a   {%- if true -%}   b   {%- endif -%}   c"), "abc");
  EXPECT_EQ(render("{{- ' x ' -}}\n"), " x ");
  EXPECT_EQ(render("{# comment #}{% macro m(who, greet='hi') %}{{ greet }} {{ who }}{% endmacro %}{{ "
                   "m('you') }}|{{ m('me', greet='yo') }}"),
            "hi you|yo me");
  EXPECT_EQ(render("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]"), "[in1]");
}

TEST(ChatTemplate, ErrorsNameTheConstructAndPosition) {
  EXPECT_THAT(error_of("{{ raise_exception('Only user and assistant roles') }}"),
              HasSubstr("chat template raised an exception: Only user and assistant roles"));
  EXPECT_THAT(error_of("ab\n{% include 'x' %}"), HasSubstr("statement {% include %} is not supported"));
  EXPECT_THAT(error_of("ab\n{% include 'x' %}"), HasSubstr("line 2, column 1"));
  EXPECT_THAT(error_of("{{ x | wordwrap }}"), HasSubstr("filter 'wordwrap' is not supported"));
  EXPECT_THAT(error_of("{{ x is foo }}"), HasSubstr("test 'foo' is not supported"));
  EXPECT_THAT(error_of("{{ 'a'.zfill(3) }}"), HasSubstr("method zfill() of a string is not supported"));
  EXPECT_THAT(error_of("{% if x %}no end"), HasSubstr("template ends inside a block"));
  EXPECT_THAT(error_of("a{% endfor %}"),
              HasSubstr("{% endfor %} has no open block to belong to at line 1, column 2"));
  EXPECT_THAT(error_of("{{ 1 + 'a' }}"), HasSubstr("operator + on a integer and a string"));
  EXPECT_THAT(error_of("{{ x "), HasSubstr("not closed"));
  // Malformed templates are errors too, never a hang or a crash.
  for (const char* bad :
       {"{{ x | }}", "{% for %}", "{{ (1 }}", "{% set %}", "{{ [1, }}", "{{ {'a' }}", "{% macro m( %}",
        "{{ 'unterminated }}", "{% if %}{% endif %}", "{{ x[1:2:3:4] }}", "{% endfor %}"})
    EXPECT_THAT(error_of(bad), HasSubstr("chat template: ")) << bad;
}

}  // namespace
}  // namespace expar
