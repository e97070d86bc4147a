#pragma once
// Temporary folders of the tests. Each is new: named after the process and a per-process count, so the tests
// of one program, and programs that ctest runs side by side, never share one (a fixed name would let one
// test's clean-up delete another's files).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace expar::test {

// A new empty folder <system temp>/expar_<tag>_<pid>_<n>; the caller removes it (or use TempDir,
// run_temp_dir).
inline std::filesystem::path make_temp_dir(std::string_view tag) {
  static std::atomic<int> count{0};
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() /
      ("expar_" + std::string(tag) + "_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
  std::filesystem::remove_all(p);  // left by an earlier process of the same id
  std::filesystem::create_directories(p);
  return p;
}

// A new folder, removed with its contents at scope exit.
class TempDir {
 public:
  explicit TempDir(std::string_view tag) : path_(make_temp_dir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Folders that outlive the test that made them (a checkpoint written once and shared by a program's tests),
// removed when the program's tests are done.
class RemoveRunTempDirs : public ::testing::Environment {
 public:
  static void add(const std::filesystem::path& p) {
    std::lock_guard lock(mutex());
    dirs().push_back(p);
  }
  void TearDown() override {
    std::lock_guard lock(mutex());
    for (const std::filesystem::path& d : dirs()) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
    dirs().clear();
  }

 private:
  static std::vector<std::filesystem::path>& dirs() {
    static std::vector<std::filesystem::path> d;
    return d;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
};
inline const auto* const kRemoveRunTempDirs = ::testing::AddGlobalTestEnvironment(new RemoveRunTempDirs);

// A new folder, removed at the end of the program's tests.
inline std::filesystem::path run_temp_dir(std::string_view tag) {
  std::filesystem::path p = make_temp_dir(tag);
  RemoveRunTempDirs::add(p);
  return p;
}

}  // namespace expar::test
