// Every command block of README.md runs as written (each ```sh block as one bash script, its lines in
// order, stopping at the first failure), scaled down where it trains or measures. New blocks are picked up
// without editing this test; what the test changes or leaves out is listed below, each with its reason, so a
// README command that needs a new exception shows up as a failing test.
// The scripts run in a scratch directory that mirrors the repository's relative paths (data/, scripts/,
// tests/, build/release/expar), so runs/ and logs land there, not in the source tree.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "run_process.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;

// `line` with `extra` added before its trailing comment ("  # ...") or at its end.
std::string append_option(const std::string& line, const std::string& extra) {
  const size_t comment = line.find("  #");
  if (comment == std::string::npos) return line + " " + extra;
  return line.substr(0, comment) + " " + extra + line.substr(comment);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Substitution {
  std::function<std::string(const std::string&)> apply;
  std::string why;
};

// Applied to every line, in order.
const std::vector<Substitution>& scale_down() {
  static const std::vector<Substitution> rules = {
      {[](const std::string& l) {
         const size_t at = l.find("--steps ");
         if (at == std::string::npos) return l;
         const size_t end = l.find_first_not_of("0123456789", at + 8);
         return l.substr(0, at) + "--steps 2" + (end == std::string::npos ? "" : l.substr(end));
       },
       "training runs two steps: enough to show the command works"},
      {[](const std::string& l) {
         return contains(l, " train ") && !contains(l, "--steps") ? append_option(l, "--steps 2") : l;
       },
       "train lines without --steps (default 300) also run two"},
      {[](const std::string& l) {
         const std::string big = "--tokens 1024 --d-model 512 --expert-hidden 1024";
         const size_t at = l.find(big);
         if (at == std::string::npos) return l;
         return l.substr(0, at) + "--tokens 64 --d-model 64 --expert-hidden 64 --repeats 1 --warmup 0" +
                l.substr(at + big.size());
       },
       "bench paths at a small shape, one repeat"},
      {[](const std::string& l) {
         return contains(l, "bench comm") ? append_option(l, "--repeats 1 --bytes 65536") : l;
       },
       "bench comm: one repeat of the smallest transfer"},
  };
  return rules;
}

struct Exclusion {
  std::string part;  // a line containing this is not run
  std::string why;
};

// Lines left out.
const std::vector<Exclusion>& not_run() {
  static const std::vector<Exclusion> rules = {
      {"./scripts/demo", "sets up, builds and trains for minutes (the demo itself)"},
      {"./scripts/test", "sets up and builds the whole project (scripts/test runs this very test)"},
      {"--checkpoint hf/", "needs a Hugging Face checkpoint downloaded by the user (tests have no network)"},
      {" layer layer.safetensors", "needs the user's own layer.safetensors"},
      {"./scripts/build release expar",
       "the test runs the expar binary CTest built (the scratch folder has no sources)"},
  };
  return rules;
}

std::vector<std::vector<std::string>> readme_blocks() {
  std::ifstream in(EXPAR_SOURCE_DIR "/README.md");
  std::vector<std::vector<std::string>> blocks;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && (line == "```sh" || line == "```bash")) {
      inside = true;
      blocks.emplace_back();
    } else if (inside && line.rfind("```", 0) == 0) {
      inside = false;
    } else if (inside) {
      blocks.back().push_back(line);
    }
  }
  return blocks;
}

TEST(ReadmeCommands, EveryBlockRunsAsWritten) {
  const fs::path scratch = test::make_temp_dir("readme");
  fs::create_directories(scratch / "build" / "release");
  fs::create_symlink(EXPAR_SOURCE_DIR "/data", scratch / "data");
  fs::create_symlink(EXPAR_SOURCE_DIR "/scripts", scratch / "scripts");
  fs::create_symlink(EXPAR_SOURCE_DIR "/tests", scratch / "tests");  // the npm reference vocabularies
  fs::create_symlink(EXPAR_BINARY, scratch / "build" / "release" / "expar");
  const auto blocks = readme_blocks();
  ASSERT_GE(blocks.size(), 2u) << "no ```sh blocks found in README.md";
  int lines_run = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::string script = "set -euo pipefail\nset -x\n";
    for (std::string line : blocks[b]) {
      bool skip = false;
      for (const Exclusion& e : not_run())
        if (contains(line, e.part)) {
          std::cout << "[README block " << b << "] not run (" << e.why << "): " << line << "\n";
          skip = true;
        }
      if (skip) continue;
      for (const Substitution& s : scale_down()) line = s.apply(line);
      script += line + "\n";
      if (!line.empty() && line[0] != '#' && line.find('=') == std::string::npos) ++lines_run;
    }
    const fs::path file = scratch / ("block" + std::to_string(b) + ".sh");
    std::ofstream(file) << script;
    const testing::ProcessResult r =
        testing::run_process({"bash", file.string()}, {{"OMP_NUM_THREADS", "1"}}, 600, "", scratch.string());
    EXPECT_EQ(r.exit_code, 0) << "README block " << b << " failed; the script run:\n"
                              << script << "\noutput:\n"
                              << r.output;
  }
  EXPECT_GE(lines_run, 8) << "fewer README commands ran than expected: check the block parsing";
  fs::remove_all(scratch);
}

}  // namespace
}  // namespace expar
