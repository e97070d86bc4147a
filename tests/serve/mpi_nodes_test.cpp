// `expar serve --transport mpi` across emulated nodes, as a user starts it: scripts/mpirun-nodes 2 1 expar
// serve --transport mpi (rank 0, the HTTP front end and scheduler, on node 0; rank 1 on node 1; TCP between
// them, the network namespaces of scripts/mpirun-nodes). Rank 0 listens on the loopback of node 0's
// namespace, so the client joins that namespace (setns on a thread of its own) as a client on node 0 would.
// Its answers must equal the threads transport's on the same layout, and SIGKILL of the rank on node 1 must
// end the server with a message naming that rank. Skipped with the script's reason where network namespaces
// cannot be made (exit 77), or where Open MPI's mpirun is missing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve/mpi_server.hpp"
#include "serve/serve_test_model.hpp"
#include "serve/test_server.hpp"

namespace expar::serve {
namespace {

using nlohmann::json;

// Runs fn on a thread of its own inside the network namespace `ns` (setns moves only the calling thread, so
// the test's other threads stay where they are). Returns what failed, "" when fn ran.
std::string in_namespace(const std::string& ns, const std::function<void()>& fn) {
  std::string error;
  std::thread t([&] {
    const std::string path = "/run/netns/" + ns;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error = "cannot open " + path + ": " + std::strerror(errno);
      return;
    }
    const int rc = ::setns(fd, CLONE_NEWNET);
    const int saved = errno;
    ::close(fd);
    if (rc != 0) {
      error = "setns(" + path + ") failed: " + std::strerror(saved);
      return;
    }
    fn();
  });
  t.join();
  return error;
}

// The inode of a network namespace: the same for a process inside it and for its /run/netns name.
ino_t netns_inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The process of world rank `rank` inside the network namespace `ns` (Open MPI's daemons detach from
// mpirun, so the ranks are found by namespace, not by parent). -1 if none.
pid_t rank_in_namespace(const std::string& ns, int rank) {
  const ino_t want = netns_inode("/run/netns/" + ns);
  if (want == 0) return -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e.path().filename().c_str()));
    if (pid > 0 && netns_inode("/proc/" + std::to_string(pid) + "/ns/net") == want &&
        testing::is_rank(pid, rank))
      return pid;
  }
  return -1;
}

// A completion and a chat request, greedy and seeded sampling.
std::vector<std::pair<std::string, json>> requests() {
  return {{"/v1/completions", json{{"prompt", "In the beginning"}, {"max_tokens", 12}, {"temperature", 0}}},
          {"/v1/completions", json{{"prompt", "And God said"},
                                   {"max_tokens", 10},
                                   {"temperature", 0.9},
                                   {"top_p", 0.95},
                                   {"seed", 42}}},
          {"/v1/chat/completions",
           json{{"messages", testing::kMessages}, {"max_tokens", 10}, {"temperature", 0}}},
          {"/v1/chat/completions",
           json{{"messages", testing::kMessages}, {"max_tokens", 10}, {"temperature", 0.7}, {"seed", 7}}}};
}

class MpiNodes : public testing::MpiServe, public ::testing::WithParamInterface<testing::Layout> {};

TEST_P(MpiNodes, AnswersEqualTheThreadsTransportAndAKilledNodeEndsTheServer) {
  const std::filesystem::path dir = testing::serve_test_model_with_tokenizer();
  const std::vector<std::pair<std::string, json>> reqs = requests();
  std::vector<json> expected;
  {
    testing::TestServer threads(testing::threads_options(dir, GetParam()));
    for (const auto& [route, body] : reqs)
      expected.push_back(testing::answer(testing::post(threads.port, route, body)));
  }
  testing::MpiServer mpi(dir, GetParam(), "60", {EXPAR_MPIRUN_NODES, "2", "1"});
  if (mpi.port == 0) {
    const ::expar::testing::ProcessResult r = mpi.process().finish(60);
    if (r.exit_code == 77) GTEST_SKIP() << r.output;
    FAIL() << "the server never listened: " << r.output;
  }

  // Rank 0 runs on node 0 and rank 1 on node 1: each inside its node's namespace (scripts/mpirun-nodes names
  // them expar<its pid>-n<node>).
  const std::string prefix = "expar" + std::to_string(mpi.process().pid()) + "-n";
  for (int rank : {0, 1})
    ASSERT_GT(rank_in_namespace(prefix + std::to_string(rank), rank), 0)
        << "rank " << rank << " is not on node " << rank << "\n"
        << mpi.process().output();

  std::vector<json> got;
  std::string metrics;
  const std::string joined = in_namespace(prefix + "0", [&] {
    for (const auto& [route, body] : reqs)
      got.push_back(testing::answer(testing::post(mpi.port, route, body)));
    auto res = mpi.client().Get("/metrics");
    if (res) metrics = res->body;
  });
  ASSERT_EQ(joined, "");
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], expected[i]) << reqs[i].second;
  // The routing load of the rank on node 1 reached rank 0 (gathered over TCP).
  for (int rank : {0, 1})
    EXPECT_NE(metrics.find("expar_expert_tokens_total{rank=\"" + std::to_string(rank) + "\""),
              std::string::npos)
        << metrics;

  // SIGKILL of the rank on node 1: its node's daemon sees it die and the job ends on node 0 with mpirun's
  // message naming the rank, long before the comm timeout.
  const pid_t follower = rank_in_namespace(prefix + "1", 1);
  ASSERT_GT(follower, 0);
  const auto killed = std::chrono::steady_clock::now();
  ::kill(follower, SIGKILL);
  const ::expar::testing::ProcessResult r = mpi.process().finish(60);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_FALSE(r.killed_at_limit) << r.output;
  EXPECT_LT(seconds, 30.0) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, MpiNodes, ::testing::Values(testing::Layout{2, 1}, testing::Layout{1, 2}),
                         [](const auto& info) { return testing::layout_name(info.param); });

}  // namespace
}  // namespace expar::serve
