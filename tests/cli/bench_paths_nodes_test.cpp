// `expar bench paths --transport mpi` run as a user would (the expar binary under scripts/mpirun-nodes and
// scripts/mpirun-local), its MESSAGES figures compared field for field with the threads backend's emulated
// nodes of the same shape and seed: the node of each rank comes from MPI (MPI_COMM_TYPE_SHARED) and the MPI
// Comm and heap count what crosses a node boundary (MPI_Put/MPI_Get, collectives). Counts, not times.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "expar/io/text_file.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ProcessResult;
using testing::run_process;

const std::string kMpirunLocal = EXPAR_SOURCE_DIR "/scripts/mpirun-local";
const std::string kMpirunNodes = EXPAR_SOURCE_DIR "/scripts/mpirun-nodes";

// A tiny shape: every path, one repeat (the counts are deterministic for given routes).
const std::vector<std::string> kShape = {
    "bench",           "paths", "--tokens",  "16", "--d-model",           "16",
    "--expert-hidden", "16",    "--experts", "8",  "--experts-per-token", "2",
    "--repeats",       "1",     "--warmup",  "0",  "--no-memory",         "--oversubscribe"};

class BenchPathsNodes : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::make_temp_dir("bench_paths_nodes"); }
  void TearDown() override { fs::remove_all(dir_); }

  // `launcher` (e.g. mpirun-nodes 2 2) + expar + the shape + `extra` + --json FILE. Returns the run; its
  // JSON in `out` when it exited 0.
  ProcessResult run(const std::vector<std::string>& launcher, const std::vector<std::string>& extra,
                    const std::string& name, json& out) {
    const std::string file = (dir_ / (name + ".json")).string();
    std::vector<std::string> argv = launcher;
    argv.push_back(EXPAR_BINARY);
    argv.insert(argv.end(), kShape.begin(), kShape.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"--json", file});
    ProcessResult r = run_process(argv, {}, 500);
    if (r.exit_code == 0) out = json::parse(read_text_file(file, "the --json file"));
    return r;
  }

  // Every path's traffic of the MPI run equals the threads run's, field for field.
  static void expect_same_traffic(const json& threads, const json& mpi) {
    ASSERT_EQ(threads.at("paths").size(), mpi.at("paths").size());
    for (size_t i = 0; i < threads.at("paths").size(); ++i) {
      const json& t = threads["paths"][i];
      const json& m = mpi["paths"][i];
      ASSERT_EQ(t.at("path"), m.at("path"));
      for (const char* kind : {"collective", "one_sided"})
        for (const char* field :
             {"inter_node_messages", "inter_node_bytes", "intra_node_messages", "intra_node_bytes"})
          EXPECT_EQ(t["traffic_per_step"][kind][field], m["traffic_per_step"][kind][field])
              << t["path"] << " " << kind << " " << field;
    }
  }

  static const json& path_of(const json& report, const std::string& name) {
    for (const json& p : report.at("paths"))
      if (p.at("path") == name) return p;
    ADD_FAILURE() << "no path " << name << " in the report";
    return report;
  }

  fs::path dir_;
};

TEST_F(BenchPathsNodes, TwoNamespaceNodesCountWhatTheEmulatedNodesCount) {
  json mpi, threads;
  const ProcessResult m = run({kMpirunNodes, "2", "2"}, {"--transport", "mpi"}, "mpi", mpi);
  if (m.exit_code == 77) GTEST_SKIP() << m.output;
  ASSERT_EQ(m.exit_code, 0) << m.output;
  const ProcessResult t = run({}, {"--ranks", "4", "--ranks-per-node", "2"}, "threads", threads);
  ASSERT_EQ(t.exit_code, 0) << t.output;

  // The layout came from MPI: 2 nodes of 2 ranks, as the threads run emulated it.
  EXPECT_EQ(mpi["options"]["transport"], "mpi");
  EXPECT_EQ(mpi["options"]["ranks"], 4);
  EXPECT_EQ(mpi["options"]["nodes"], 2);
  EXPECT_EQ(mpi["options"]["ranks_per_node"], 2);
  EXPECT_EQ(threads["options"]["nodes"], 2);
  expect_same_traffic(threads, mpi);

  // aggregated: one message per (rank, other node) and leg: ranks x (nodes - 1) x 4.
  const int64_t ranks = mpi["options"]["ranks"], nodes = mpi["options"]["nodes"];
  const json& aggregated = path_of(mpi, "aggregated")["traffic_per_step"]["one_sided"];
  EXPECT_EQ(aggregated["inter_node_messages"], ranks * (nodes - 1) * 4);
  // The same bytes cross in one message per route row (rowwise) and in one per node pair (aggregated).
  const json& rowwise = path_of(mpi, "rowwise")["traffic_per_step"]["one_sided"];
  EXPECT_GT(rowwise["inter_node_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(rowwise["inter_node_bytes"], aggregated["inter_node_bytes"]);
  EXPECT_GT(rowwise["inter_node_messages"].get<int64_t>(), aggregated["inter_node_messages"].get<int64_t>());
  EXPECT_GT(path_of(mpi, "block")["traffic_per_step"]["collective"]["inter_node_messages"].get<int64_t>(), 0);
  // Only rank 0 printed: one MESSAGES table.
  size_t tables = 0;
  for (size_t at = m.output.find("MESSAGES per step"); at != std::string::npos;
       at = m.output.find("MESSAGES per step", at + 1))
    ++tables;
  EXPECT_EQ(tables, 1u) << m.output;
}

TEST_F(BenchPathsNodes, OneNodeOfFourProcessesCountsWhatFourThreadsCount) {
  json mpi, threads;
  const ProcessResult m = run({kMpirunLocal, "-n", "4"}, {"--transport", "mpi"}, "mpi", mpi);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  const ProcessResult t = run({}, {"--ranks", "4"}, "threads", threads);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_EQ(mpi["options"]["nodes"], 1);
  EXPECT_EQ(mpi["options"]["ranks_per_node"], 4);
  expect_same_traffic(threads, mpi);
  for (const json& p : mpi["paths"]) {
    EXPECT_EQ(p["traffic_per_step"]["one_sided"]["inter_node_messages"], 0) << p["path"];
    EXPECT_EQ(p["traffic_per_step"]["collective"]["inter_node_messages"], 0) << p["path"];
  }
  EXPECT_GT(path_of(mpi, "block")["traffic_per_step"]["collective"]["intra_node_bytes"].get<int64_t>(), 0);
}

// The node layout under MPI is MPI's, and the ranks are the processes: both flags are refused by name
// before MPI starts.
TEST_F(BenchPathsNodes, MpiRefusesEmulatedNodesAndRanks) {
  json unused;
  const ProcessResult nodes = run({}, {"--transport", "mpi", "--ranks-per-node", "2"}, "nodes", unused);
  EXPECT_EQ(nodes.exit_code, 1) << nodes.output;
  EXPECT_NE(nodes.output.find("--ranks-per-node 2 with --transport mpi"), std::string::npos) << nodes.output;
  const ProcessResult ranks = run({}, {"--transport", "mpi", "--ranks", "4"}, "ranks", unused);
  EXPECT_EQ(ranks.exit_code, 1) << ranks.output;
  EXPECT_NE(ranks.output.find("--ranks 4 with --transport mpi"), std::string::npos) << ranks.output;
}

}  // namespace
}  // namespace expar
