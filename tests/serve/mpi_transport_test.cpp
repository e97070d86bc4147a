// `expar serve --transport mpi` as a user starts it: scripts/mpirun-local -n 2 expar serve --transport mpi
// (rank 0 serves HTTP and schedules, each step's plan is broadcast, the sampled tokens come back). Its
// answers must equal the threads transport's on the same layout: completions and chat, greedy and seeded
// sampling, streamed and whole, requests alone and in parallel, and the official OpenAI client's view. A
// client that disconnects frees its slot; SIGTERM to mpirun-local finishes the stream in flight and every
// rank exits 0; a rank that dies or stops takes the job down with a message. Skipped, saying why, where
// Open MPI's mpirun is not installed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <future>
#include <nlohmann/json.hpp>
#include <regex>

#include "serve/mpi_server.hpp"
#include "serve/openai_client.hpp"
#include "serve/serve_test_model.hpp"
#include "serve/stream_client.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;
using testing::answer;
using testing::kMessages;
using testing::Layout;
using testing::MpiServe;
using testing::MpiServer;
using testing::post;
using testing::rank_pid;
using testing::threads_options;

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

  // /metrics counts the routing load of every rank, the follower's gathered to rank 0.
  auto metrics = mpi.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  for (int rank : {0, 1})
    EXPECT_NE(metrics->body.find("expar_expert_tokens_total{rank=\"" + std::to_string(rank) + "\""),
              std::string::npos)
        << metrics->body;

  mpi.process().signal(SIGTERM);
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expar serve: stopped"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MpiTransport, ::testing::Values(Layout{1, 2}, Layout{2, 1}),
                         [](const auto& info) { return testing::layout_name(info.param); });

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

// A rank that dies takes the job down with a message naming it (Open MPI sees the process end).
TEST_F(MpiServe, AFollowerThatDiesEndsTheJob) {
  MpiServer mpi(testing::serve_test_model(), Layout{1, 2});
  ASSERT_NE(mpi.port, 0) << mpi.process().output();
  const pid_t follower = rank_pid(mpi.process().pid(), 1);
  ASSERT_GT(follower, 0);
  ::kill(follower, SIGKILL);
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

// A rank that stops answering: rank 0's next step waits for it and ends the job at the comm timeout, with
// the operation and the group in its message.
TEST_F(MpiServe, AStoppedFollowerEndsTheJobAtTheCommTimeout) {
  MpiServer mpi(testing::serve_test_model(), Layout{1, 2}, "3");
  ASSERT_NE(mpi.port, 0) << mpi.process().output();
  const pid_t follower = rank_pid(mpi.process().pid(), 1);
  ASSERT_GT(follower, 0);
  ::kill(follower, SIGSTOP);
  auto res = mpi.client().Post("/v1/completions", json({{"prompt", "a"}, {"max_tokens", 4}}).dump(),
                               "application/json");
  EXPECT_FALSE(res && res->status == 200);  // the job ended under it
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expar: rank 0: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("timed out after 3 s"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace expar::serve
