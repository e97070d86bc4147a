// A bounded load test of expar serve over HTTP that ends by itself: 48 clients send 4 requests each (192 in
// all, 6x the concurrency bound) at a server that admits 8 generation requests at once; a client whose
// request gets a 503 (which must name --max-concurrent) retries it after a pause, at most kRetries times.
// Every request completes; every 200 holds the same tokens as that prompt's solo run (batch invariance
// under load); and /metrics counts exactly the 200s and 503s the clients saw, with nothing left running or
// waiting.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve/serve_test_model.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

constexpr int kClients = 48, kRequestsPerClient = 4, kMaxConcurrent = 8, kPrompts = 6, kRetries = 4000;

json request(int prompt) {
  return {{"prompt", "load " + std::to_string(prompt)}, {"max_tokens", 4}, {"temperature", 0}};
}

// The value of a metric line `name value` (or `name{labels} value`); -1 when absent.
double metric(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = ("\n" + text).find(key);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size() - 1));
}

TEST(HttpLoad, ManyClientsBeyondTheBoundEndWith200Or503AndMetricsAddUp) {
  RuntimeOptions o;
  o.path = testing::serve_test_model().string();
  testing::TestServer s(o, kMaxConcurrent, kClients + 8);

  // Each prompt alone first: the tokens every loaded run must reproduce.
  std::vector<json> solo(kPrompts);
  for (int p = 0; p < kPrompts; ++p) {
    auto res = s.client().Post("/v1/completions", request(p).dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    solo[static_cast<size_t>(p)] = json::parse(res->body)["choices"][0]["token_ids"];
  }

  std::mutex mutex;
  std::map<int, int> statuses;
  std::atomic<int> mismatches{0}, bad_503{0}, transport_errors{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      httplib::Client client = s.client();
      for (int i = 0; i < kRequestsPerClient; ++i) {
        const int p = (c + i) % kPrompts;
        for (int attempt = 0; attempt <= kRetries; ++attempt) {
          auto res = client.Post("/v1/completions", request(p).dump(), "application/json");
          if (!res) {
            ++transport_errors;
            break;
          }
          {
            std::lock_guard lock(mutex);
            ++statuses[res->status];
          }
          if (res->status == 503) {
            if (json::parse(res->body)["error"]["message"].get<std::string>().find("--max-concurrent") ==
                std::string::npos)
              ++bad_503;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
          }
          if (res->status == 200 &&
              json::parse(res->body)["choices"][0]["token_ids"] != solo[static_cast<size_t>(p)])
            ++mismatches;
          break;
        }
      }
    });
  for (std::thread& t : clients) t.join();

  EXPECT_EQ(transport_errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0) << "a loaded request's tokens differ from its solo run";
  EXPECT_EQ(bad_503.load(), 0) << "a 503 without the --max-concurrent message";
  for (const auto& [status, n] : statuses)
    EXPECT_TRUE(status == 200 || status == 503) << "status " << status << " x" << n;
  EXPECT_EQ(statuses[200], kClients * kRequestsPerClient) << "requests that never completed";
  std::printf("statuses: 200 x%d, 503 x%d\n", statuses[200], statuses.count(503) ? statuses[503] : 0);

  const std::string m = s.metrics();
  EXPECT_EQ(metric(m, "expar_requests_total{status=\"200\"}"), statuses[200] + kPrompts) << m;
  EXPECT_EQ(metric(m, "expar_requests_total{status=\"503\"}"), statuses.count(503) ? statuses[503] : -1.0)
      << m;
  EXPECT_EQ(metric(m, "expar_requests_running"), 0.0) << m;
  EXPECT_EQ(metric(m, "expar_requests_waiting"), 0.0) << m;
  auto health = s.client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

}  // namespace
}  // namespace expar::serve
