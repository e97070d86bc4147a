// expar serve's limits over HTTP: a client that disconnects mid-stream has its request cancelled and its
// slot freed at once (the running gauge returns to 0, the request counts as 499), and generation requests
// beyond --max-concurrent get a 503 with a message while the others go on.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "serve/serve_test_model.hpp"
#include "serve/stream_client.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;
using testing::open_stream;
using testing::wait_for;

constexpr int64_t kContext = 4096;

// The serve test model with a long context, so that a stream keeps running while the test acts.
RuntimeOptions long_context() {
  RuntimeOptions o;
  o.path = testing::serve_test_model(kContext).string();
  o.kv_cache_mb = 16;
  return o;
}

// A stream over the model's whole context: thousands of steps, still running when the test acts.
json long_stream() {
  return {{"prompt", "a"}, {"max_tokens", kContext - 1}, {"temperature", 0}, {"stream", true}};
}

TEST(HttpLimits, DisconnectMidStreamCancelsTheRequest) {
  testing::TestServer s(long_context(), 8);
  const int fd = open_stream(s.port, long_stream(), 200);
  ::close(fd);
  EXPECT_TRUE(wait_for([&] {
    const std::string m = s.metrics();
    return m.find("expar_requests_running 0") != std::string::npos &&
           m.find("expar_requests_cancelled_total 1") != std::string::npos &&
           m.find("expar_requests_total{status=\"499\"} 1") != std::string::npos;
  })) << s.metrics();
  // The server goes on serving.
  httplib::Client c("127.0.0.1", s.port);
  auto res = c.Post("/v1/completions", json({{"prompt", "b"}, {"max_tokens", 3}}).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST(HttpLimits, BeyondMaxConcurrentIs503) {
  testing::TestServer s(long_context(), 1);
  // Hold the only slot with a stream whose client reads the first event and then stops reading; the
  // server blocks on the full socket, so the request stays in flight.
  const int fd = open_stream(s.port, long_stream(), 1);
  httplib::Client c("127.0.0.1", s.port);
  auto res = c.Post("/v1/completions", json({{"prompt", "b"}, {"max_tokens", 3}}).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find("--max-concurrent"),
            std::string::npos);
  ::close(fd);
}

}  // namespace
}  // namespace expar::serve
