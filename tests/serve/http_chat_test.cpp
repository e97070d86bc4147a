// expar serve with the checkpoint's tokenizer.json and chat template: chat completions render the
// template (as transformers' apply_chat_template with add_generation_prompt) and tokenize it, completions
// tokenize text, output is decoded text, the eos token ends a generation with finish_reason "stop".
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "expar/io/tokenizer.hpp"
#include "serve/serve_test_model.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

TEST(HttpChat, TemplateTokenizerAndEos) {
  const std::filesystem::path dir = testing::serve_test_model_with_tokenizer();
  RuntimeOptions o;
  o.path = dir.string();
  o.kv_cache_mb = 4;
  testing::TestServer server(o);
  ASSERT_NE(server.codec, nullptr);
  httplib::Client c = server.client();

  const json messages = {{{"role", "system"}, {"content", "be brief"}},
                         {{"role", "user"}, {"content", "hi"}}};
  auto res = c.Post("/v1/chat/completions",
                    json({{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}}).dump(),
                    "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json chat = json::parse(res->body);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  // The prompt is the rendered template, tokenized byte for byte.
  const std::string rendered = "<system>be brief|<user>hi|<assistant>";
  EXPECT_EQ(chat["usage"]["prompt_tokens"], rendered.size());
  const std::vector<int32_t> ids = chat["choices"][0]["token_ids"];
  const Tokenizer tokenizer = Tokenizer::from_path(dir);
  EXPECT_EQ(
      chat["choices"][0]["message"]["content"],
      json::parse(json(tokenizer.decode(ids, true)).dump(-1, ' ', false, json::error_handler_t::replace)));
  // '\n' (id 10) is the eos token: never returned, and it ends the request as "stop".
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 10), 0);
  if (ids.size() < 20)
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop");
  else
    EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  // The same prompt as a completion gives the same tokens.
  auto comp =
      c.Post("/v1/completions", json({{"prompt", rendered}, {"max_tokens", 20}, {"temperature", 0}}).dump(),
             "application/json");
  ASSERT_TRUE(comp);
  EXPECT_EQ(json::parse(comp->body)["choices"][0]["token_ids"], chat["choices"][0]["token_ids"]);
}

}  // namespace
}  // namespace expar::serve
