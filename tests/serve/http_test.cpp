// expar serve over HTTP on loopback (cpp-httplib's client): the OpenAI endpoints, streaming, stop strings,
// error bodies for bad requests, metrics, and 32 concurrent requests that each equal their solo run.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "expar/serve/http_server.hpp"
#include "serve/serve_test_model.hpp"
#include "serve/stream_client.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

class Http : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    RuntimeOptions o;
    o.path = testing::serve_test_model().string();
    o.model.tp = 2;
    o.kv_cache_mb = 4;
    o.scheduler.prefill_chunk = 8;
    o.scheduler.max_batch_tokens = 64;
    runtime_ = new Runtime(o);
    codec_ = new infer::ByteCodec;
    HttpOptions h;
    h.port = 0;
    h.model_name = "tiny";
    h.threads = 40;
    server_ = new HttpServer(*runtime_, codec_, h);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->listen(); });
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    runtime_->shutdown(false);
    delete thread_;
    delete server_;
    delete codec_;
    delete runtime_;
  }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  static json post(const std::string& route, const json& body, int expect_status = 200) {
    auto res = client().Post(route.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(res) << route << ": " << httplib::to_string(res.error());
    if (!res) return {};
    EXPECT_EQ(res->status, expect_status) << res->body;
    return json::parse(res->body);
  }
  static inline Runtime* runtime_ = nullptr;
  static inline infer::ByteCodec* codec_ = nullptr;
  static inline HttpServer* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(Http, HealthModelsAndMetrics) {
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = client().Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["max_model_len"], 64);
  post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}, {"temperature", 0}});
  auto metrics = client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("expar_requests_total{status=\"200\"}"), std::string::npos);
  EXPECT_NE(metrics->body.find("expar_time_to_first_token_seconds_count"), std::string::npos);
  EXPECT_NE(metrics->body.find("expar_generation_tokens_total"), std::string::npos);
}

TEST_F(Http, CompletionTextAndTokenIdsAgree) {
  const json a = post("/v1/completions",
                      {{"model", "tiny"}, {"prompt", "In the"}, {"max_tokens", 9}, {"temperature", 0}});
  EXPECT_EQ(a["object"], "text_completion");
  EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(a["usage"]["completion_tokens"], 9);
  const std::vector<int32_t> ids = a["choices"][0]["token_ids"];
  ASSERT_EQ(ids.size(), 9u);
  // Bytes that are not UTF-8 come back as U+FFFD.
  const json expected =
      json::parse(json(codec_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace));
  EXPECT_EQ(a["choices"][0]["text"], expected);
  // The same prompt as token ids gives the same tokens.
  const json b =
      post("/v1/completions", {{"prompt", codec_->encode("In the")}, {"max_tokens", 9}, {"temperature", 0}});
  EXPECT_EQ(b["choices"][0]["token_ids"], a["choices"][0]["token_ids"]);
}

TEST_F(Http, StreamEqualsTheWholeResponse) {
  const json body = {{"prompt", "And"}, {"max_tokens", 12}, {"temperature", 0}};
  const json whole = post("/v1/completions", body);
  json streamed_body = body;
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  auto res = client().Post("/v1/completions", streamed_body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const testing::StreamEvents events = testing::stream_events(res->body);
  EXPECT_TRUE(events.done);
  EXPECT_EQ(events.usage_completion, 12);
  EXPECT_EQ(events.finish, "length");
  EXPECT_EQ(events.text, whole["choices"][0]["text"]);
}

TEST_F(Http, StopStringCutsTheText) {
  const json whole = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20}, {"temperature", 0}});
  const std::string text = whole["choices"][0]["text"];
  // A stop string of two printable ASCII bytes from the middle of the greedy output.
  const std::vector<int32_t> ids = whole["choices"][0]["token_ids"];
  size_t at = 2;
  while (at + 1 < ids.size() && !(ids[at] >= 32 && ids[at] < 127 && ids[at + 1] >= 32 && ids[at + 1] < 127))
    ++at;
  ASSERT_LT(at + 1, ids.size()) << "no two printable bytes in a row in the greedy output";
  const std::string stop{static_cast<char>(ids[at]), static_cast<char>(ids[at + 1])};
  const json cut =
      post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20}, {"temperature", 0}, {"stop", stop}});
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(Http, BadRequestsGetMessages) {
  auto raw = client().Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  EXPECT_NE(json::parse(raw->body)["error"]["message"].get<std::string>().find("not valid JSON"),
            std::string::npos);
  EXPECT_EQ(post("/v1/completions", {{"prompt", "a"}, {"max_tokens", "many"}}, 400)["error"]["param"],
            "max_tokens");
  EXPECT_EQ(post("/v1/completions", {{"prompt", "a"}, {"model", "gpt-4"}}, 404)["error"]["param"], "model");
  EXPECT_EQ(post("/v1/completions", {{"prompt", "a"}, {"n", 100}}, 400)["error"]["param"], "n");
  EXPECT_EQ(post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1000000000}}, 400)["error"]["param"],
            "max_tokens");
  EXPECT_EQ(post("/v1/completions", {{"prompt", {1, 999}}}, 400)["error"]["param"], "prompt");
  EXPECT_EQ(post("/v1/completions", {{"prompt", "a"}, {"temperature", -1}}, 400)["error"]["type"],
            "invalid_request_error");
  EXPECT_EQ(post("/v1/completions", json::array({1, 2}), 400)["error"]["type"], "invalid_request_error");
  // Our byte-level model has no chat template: chat is refused with a message, not answered wrongly.
  const json chat =
      post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, 400);
  EXPECT_NE(chat["error"]["message"].get<std::string>().find("chat template"), std::string::npos);
  auto missing = client().Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(Http, ConcurrentRequestsEqualTheirSoloRuns) {
  auto body = [](int i) {
    json b = {{"prompt", std::string(static_cast<size_t>(1 + i % 9), static_cast<char>('a' + i % 26))},
              {"max_tokens", 4 + i % 7}};
    if (i % 2) {
      b["temperature"] = 0.8;
      b["seed"] = i;
    } else {
      b["temperature"] = 0;
    }
    return b;
  };
  std::vector<json> solo;
  for (int i = 0; i < 32; ++i) solo.push_back(post("/v1/completions", body(i))["choices"][0]["token_ids"]);
  std::vector<std::future<json>> together;
  for (int i = 0; i < 32; ++i)
    together.push_back(std::async(std::launch::async, [&, i] { return post("/v1/completions", body(i)); }));
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(together[static_cast<size_t>(i)].get()["choices"][0]["token_ids"], solo[static_cast<size_t>(i)])
        << "request " << i;
}

}  // namespace
}  // namespace expar::serve
