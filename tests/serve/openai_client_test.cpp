// expar serve against the official OpenAI client (npm "openai", pinned in tests/serve/reference, installed by
// scripts/setup): models, completions and chat, plain and streamed (the stream equals the whole response),
// a seeded sample repeated, and error statuses the client raises as APIError. The client's texts must equal
// what the server returns to a plain HTTP request.
#include "serve/openai_client.hpp"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "serve/serve_test_model.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

TEST(OpenAiClient, TalksToExparServe) {
  ASSERT_TRUE(std::filesystem::exists(testing::kOpenAiReference / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is missing in " << testing::kOpenAiReference << ": run scripts/setup";
  const std::filesystem::path dir = testing::serve_test_model_with_tokenizer();
  RuntimeOptions o;
  o.path = dir.string();
  o.kv_cache_mb = 4;
  testing::TestServer server(o);

  const testing::ClientRun run = testing::run_openai_client(server.port, "tiny");
  ASSERT_EQ(run.status, 0) << run.output;
  const json seen = json::parse(run.output.substr(run.output.find('{')));

  httplib::Client c = server.client();
  auto res =
      c.Post("/v1/completions",
             json({{"model", "tiny"}, {"prompt", "In the beginning"}, {"max_tokens", 12}, {"temperature", 0}})
                 .dump(),
             "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(seen["text"], json::parse(res->body)["choices"][0]["text"]);
  EXPECT_NE(seen["errors"]["n"].get<std::string>().find("n=3"), std::string::npos) << seen.dump();
  EXPECT_NE(seen["errors"]["model"].get<std::string>().find("no-such-model"), std::string::npos);
}

}  // namespace
}  // namespace expar::serve
