// `expar serve --transport mpi` as a user starts it: scripts/mpirun-local -n 2 expar serve --transport mpi
// (rank 0 serves HTTP and schedules, each step's plan is broadcast, the sampled tokens come back). Its
// answers must equal the threads transport's on the same layout: completions and chat, greedy and seeded
// sampling, streamed and whole, requests alone and in parallel, and the official OpenAI client's view. A
// client that disconnects frees its slot; SIGTERM to mpirun-local finishes the stream in flight and every
// rank exits 0. Skipped, saying why, where Open MPI's mpirun is not installed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <regex>

#include "run_process.hpp"
#include "serve/openai_client.hpp"
#include "serve/serve_test_model.hpp"
#include "serve/stream_client.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

bool mpirun_installed() {
  return ::expar::testing::run_process({"mpirun", "--version"}, {}, 60).exit_code == 0;
}

// Every test here starts mpirun.
class MpiServe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpirun_installed())
      GTEST_SKIP() << "Open MPI's mpirun is not installed here: `expar serve --transport mpi` cannot start "
                      "(scripts/setup installs openmpi-bin)";
  }
};

// The layouts under test: TP x DP over two processes.
struct Layout {
  int tp, dp;
};

RuntimeOptions threads_options(const std::filesystem::path& dir, Layout l) {
  RuntimeOptions o;
  o.path = dir.string();
  o.model.tp = l.tp;
  o.model.dp = l.dp;
  o.model.compute_threads = 1;
  o.kv_cache_mb = 4;
  o.scheduler.prefill_chunk = 8;
  o.scheduler.max_batch_tokens = 64;
  return o;
}

// The same server under mpirun, one process per rank, with the options of threads_options.
class MpiServer {
 public:
  MpiServer(const std::filesystem::path& dir, Layout l)
      : process_({EXPAR_MPIRUN_LOCAL,
                  "-n",
                  std::to_string(l.tp * l.dp),
                  EXPAR_BINARY,
                  "serve",
                  "--transport",
                  "mpi",
                  "--path",
                  dir.string(),
                  "--tp",
                  std::to_string(l.tp),
                  "--dp",
                  std::to_string(l.dp),
                  "--threads",
                  "1",
                  "--kv-cache-mb",
                  "4",
                  "--prefill-chunk",
                  "8",
                  "--max-batch-tokens",
                  "64",
                  "--model-name",
                  "tiny",
                  "--port",
                  "0"},
                 {{"EXPAR_COMM_TIMEOUT", "60"}}) {
    const std::string p =
        process_.wait_for_output(std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)\n"), 120);
    port = p.empty() ? 0 : std::stoi(p);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  ::expar::testing::ChildProcess& process() { return process_; }
  int port = 0;

 private:
  ::expar::testing::ChildProcess process_;
};

json post(int port, const std::string& route, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto res = c.Post(route, body.dump(), "application/json");
  if (!res) return {{"transport_error", httplib::to_string(res.error())}};
  json j = json::parse(res->body);
  j["http_status"] = res->status;
  return j;
}

// What must be equal between two servers: the choices' texts, tokens and finish reasons, the usage.
json answer(const json& response) {
  if (!response.contains("choices")) return response;
  json a = {{"usage", response["usage"]}, {"http_status", response["http_status"]}};
  for (json c : response["choices"]) {
    c.erase("index");
    a["choices"].push_back(c);
  }
  return a;
}

const json kMessages = {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}};

// The requests compared: greedy and seeded sampling, completions and chat.
std::vector<std::pair<std::string, json>> requests() {
  std::vector<std::pair<std::string, json>> r;
  const char* prompts[] = {"In the beginning", "And God said", "x", "Let there be light, and there was"};
  for (const char* p : prompts) {
    r.emplace_back("/v1/completions", json{{"prompt", p}, {"max_tokens", 12}, {"temperature", 0}});
    r.emplace_back(
        "/v1/completions",
        json{{"prompt", p}, {"max_tokens", 10}, {"temperature", 0.9}, {"top_p", 0.95}, {"seed", 42}});
  }
  r.emplace_back("/v1/chat/completions",
                 json{{"messages", kMessages}, {"max_tokens", 10}, {"temperature", 0}});
  r.emplace_back("/v1/chat/completions",
                 json{{"messages", kMessages}, {"max_tokens", 10}, {"temperature", 0.7}, {"seed", 7}});
  return r;
}

class MpiTransport : public MpiServe, public ::testing::WithParamInterface<Layout> {};

TEST_P(MpiTransport, AnswersEqualTheThreadsTransport) {
  const std::filesystem::path dir = testing::serve_test_model_with_tokenizer();
  const std::vector<std::pair<std::string, json>> reqs = requests();
  std::vector<json> expected;
  json expected_client;
  {
    testing::TestServer threads(threads_options(dir, GetParam()));
    for (const auto& [route, body] : reqs) expected.push_back(answer(post(threads.port, route, body)));
    const testing::ClientRun run = testing::run_openai_client(threads.port, "tiny");
    ASSERT_EQ(run.status, 0) << run.output;
    expected_client = json::parse(run.output.substr(run.output.find('{')));
  }
  MpiServer mpi(dir, GetParam());
  ASSERT_NE(mpi.port, 0) << mpi.process().output();

  // One at a time, then all at once (both replicas busy, steps mixing prefill and decode).
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(answer(post(mpi.port, reqs[i].first, reqs[i].second)), expected[i]) << reqs[i].second;
  std::vector<std::future<json>> parallel;
  for (const auto& [route, body] : reqs)
    parallel.push_back(
        std::async(std::launch::async, [&, route, body] { return answer(post(mpi.port, route, body)); }));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(parallel[i].get(), expected[i]) << reqs[i].second;

  // Streamed: the events join to the whole answer.
  for (size_t i = 0; i < reqs.size(); ++i) {
    json body = reqs[i].second;
    body["stream"] = true;
    auto res = mpi.client().Post(reqs[i].first, body.dump(), "application/json");
    ASSERT_TRUE(res);
    const testing::StreamEvents events = testing::stream_events(res->body);
    EXPECT_TRUE(events.done) << res->body;
    const json& choice = expected[i]["choices"][0];
    EXPECT_EQ(events.text, choice.contains("text") ? choice["text"] : choice["message"]["content"]);
    EXPECT_EQ(events.finish, choice["finish_reason"]);
  }

  const testing::ClientRun run = testing::run_openai_client(mpi.port, "tiny");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(json::parse(run.output.substr(run.output.find('{'))), expected_client);

  mpi.process().signal(SIGTERM);
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expar serve: stopped"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MpiTransport, ::testing::Values(Layout{1, 2}, Layout{2, 1}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "_dp" +
                                  std::to_string(info.param.dp);
                         });

// A long stream: hundreds of steps, still running when the test acts.
json long_stream(int64_t max_tokens) {
  return {{"prompt", "a"},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}}};
}

TEST_F(MpiServe, DisconnectFreesTheSlotAndSigtermFinishesTheStreamInFlight) {
  constexpr int64_t kContext = 1024;
  MpiServer mpi(testing::serve_test_model(kContext), Layout{1, 2});
  ASSERT_NE(mpi.port, 0) << mpi.process().output();
  auto metrics = [&] {
    auto res = mpi.client().Get("/metrics");
    return res ? res->body : std::string();
  };

  // A client that goes away mid-stream: its request is cancelled and its slot freed on rank 0's scheduler,
  // which tells the ranks to remove the sequence.
  ::close(testing::open_stream(mpi.port, long_stream(kContext - 1), 200));
  EXPECT_TRUE(testing::wait_for([&] {
    const std::string m = metrics();
    return m.find("expar_requests_running 0") != std::string::npos &&
           m.find("expar_requests_cancelled_total 1") != std::string::npos;
  })) << metrics();

  // SIGTERM while a stream runs: it still gets every token, [DONE], and every rank exits 0.
  std::string first;
  const int fd = testing::open_stream(mpi.port, long_stream(400), 200, &first);
  mpi.process().signal(SIGTERM);
  const testing::StreamEvents events = testing::stream_events(first + testing::read_to_end(fd));
  ::close(fd);
  EXPECT_TRUE(events.done);
  EXPECT_EQ(events.finish, "length");
  EXPECT_EQ(events.usage_completion, 400);
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("finishing the requests in flight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expar serve: stopped"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace expar::serve
