#pragma once
// Runs the official OpenAI client script (reference/client_test.mjs: npm "openai", pinned in
// tests/serve/reference, installed by scripts/setup) against a server on loopback.
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace expar::serve::testing {

inline const std::filesystem::path kOpenAiReference =
    std::filesystem::path(EXPAR_TESTS_DIR) / "serve" / "reference";

struct ClientRun {
  int status = -1;     // pclose's status: 0 when every check of the script passed
  std::string output;  // the script's JSON summary, or its failure message
};

// model: the name the server serves.
inline ClientRun run_openai_client(int port, const std::string& model) {
  const std::string command = "node '" + (kOpenAiReference / "client_test.mjs").string() +
                              "' http://127.0.0.1:" + std::to_string(port) + "/v1 " + model + " 2>&1";
  ClientRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) run.output.append(buf.data(), n);
  run.status = ::pclose(pipe);
  return run;
}

}  // namespace expar::serve::testing
