#pragma once
// `expar serve --transport mpi` started as a user starts it, for the tests that compare it with the threads
// transport: under scripts/mpirun-local on one machine (tests/serve/mpi_transport_test.cpp) or under
// scripts/mpirun-nodes on emulated nodes (tests/serve/mpi_nodes_test.cpp). The requests compared, what of a
// response must be equal, and how a test finds the process of one rank among mpirun's descendants.
#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "expar/serve/runtime.hpp"
#include "run_process.hpp"

namespace expar::serve::testing {

inline bool mpirun_installed() {
  return ::expar::testing::run_process({"mpirun", "--version"}, {}, 60).exit_code == 0;
}

// Every test of these files starts mpirun.
class MpiServe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpirun_installed())
      GTEST_SKIP() << "Open MPI's mpirun is not installed here: `expar serve --transport mpi` cannot start "
                      "(scripts/setup installs openmpi-bin)";
  }
};

// The layouts under test: TP x DP over two processes, with expert parallelism (full EP on TP 2, cross-DP EP
// on DP 2: the step plans whose MoE phases span the replicas) unless expert_parallel is false.
struct Layout {
  int tp, dp;
  bool expert_parallel = true;
};

// "tp2_dp1_ep": the test name's suffix.
inline std::string layout_name(Layout l) {
  return "tp" + std::to_string(l.tp) + "_dp" + std::to_string(l.dp) + (l.expert_parallel ? "_ep" : "");
}

inline RuntimeOptions threads_options(const std::filesystem::path& dir, Layout l) {
  RuntimeOptions o;
  o.path = dir.string();
  o.model.tp = l.tp;
  o.model.dp = l.dp;
  o.model.enable_expert_parallel = l.expert_parallel;
  o.model.compute_threads = 1;
  o.kv_cache_mb = 4;
  o.scheduler.prefill_chunk = 8;
  o.scheduler.max_batch_tokens = 64;
  return o;
}

// The same server under `launcher` (default: scripts/mpirun-local -n TP*DP), one process per rank, with the
// options of threads_options. Rank 0 listens on its own loopback (inside its node's network namespace under
// scripts/mpirun-nodes). port is 0 when it never said it listens (output() says why).
class MpiServer {
 public:
  MpiServer(const std::filesystem::path& dir, Layout l, const std::string& comm_timeout = "60",
            std::vector<std::string> launcher = {})
      : process_(command(dir, l,
                         launcher.empty()
                             ? std::vector<std::string>{EXPAR_MPIRUN_LOCAL, "-n", std::to_string(l.tp * l.dp)}
                             : std::move(launcher)),
                 {{"EXPAR_COMM_TIMEOUT", comm_timeout}}) {
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
  static std::vector<std::string> command(const std::filesystem::path& dir, Layout l,
                                          std::vector<std::string> argv) {
    for (const std::string& a : {std::string(EXPAR_BINARY),
                                 std::string("serve"),
                                 std::string("--transport"),
                                 std::string("mpi"),
                                 std::string("--checkpoint"),
                                 dir.string(),
                                 std::string("--tp"),
                                 std::to_string(l.tp),
                                 std::string("--dp"),
                                 std::to_string(l.dp),
                                 std::string("--threads"),
                                 std::string("1"),
                                 std::string("--kv-cache-mb"),
                                 std::string("4"),
                                 std::string("--prefill-chunk"),
                                 std::string("8"),
                                 std::string("--max-batch-tokens"),
                                 std::string("64"),
                                 std::string("--model-name"),
                                 std::string("tiny"),
                                 std::string("--port"),
                                 std::string("0")})
      argv.push_back(a);
    if (l.expert_parallel) argv.emplace_back("--enable-expert-parallel");
    return argv;
  }
  ::expar::testing::ChildProcess process_;
};

inline nlohmann::json post(int port, const std::string& route, const nlohmann::json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto res = c.Post(route, body.dump(), "application/json");
  if (!res) return {{"transport_error", httplib::to_string(res.error())}};
  nlohmann::json j = nlohmann::json::parse(res->body);
  j["http_status"] = res->status;
  return j;
}

// What must be equal between two servers: the choices' texts, tokens and finish reasons, the usage.
inline nlohmann::json answer(const nlohmann::json& response) {
  if (!response.contains("choices")) return response;
  nlohmann::json a = {{"usage", response["usage"]}, {"http_status", response["http_status"]}};
  for (nlohmann::json c : response["choices"]) {
    c.erase("index");
    a["choices"].push_back(c);
  }
  return a;
}

inline const nlohmann::json kMessages = {{{"role", "system"}, {"content", "be brief"}},
                                         {{"role", "user"}, {"content", "hi"}}};

// The process of world rank `rank` among the descendants of `launcher` (mpirun-local -> mpirun -> ranks): the
// one whose environment has OMPI_COMM_WORLD_RANK=rank. -1 if none.
inline bool is_rank(pid_t pid, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  std::ifstream env("/proc/" + std::to_string(pid) + "/environ");
  for (std::string var; std::getline(env, var, '\0');)
    if (var == want) return true;
  return false;
}

inline pid_t rank_pid(pid_t launcher, int rank) {
  std::multimap<pid_t, pid_t> children;  // parent -> child
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(proc)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
      std::string line;
      std::getline(stat, line);
      const size_t close = line.rfind(')');  // the command name may hold spaces
      if (close == std::string::npos) continue;
      char state = 0;
      pid_t parent = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &parent) == 2)
        children.emplace(parent, pid);
    }
    ::closedir(proc);
  }
  std::vector<pid_t> todo = {launcher};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    if (is_rank(p, rank)) return p;
    for (auto [it, end] = children.equal_range(p); it != end; ++it) todo.push_back(it->second);
  }
  return -1;
}

}  // namespace expar::serve::testing
