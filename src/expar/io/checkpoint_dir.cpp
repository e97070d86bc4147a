#include "expar/io/checkpoint_dir.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "expar/core/error.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/strict_json.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLatest = "latest";
constexpr std::string_view kStepPrefix = "step-";
constexpr std::string_view kPartialSuffix = ".partial";

// "step-<N>" -> N, or -1 for any other name.
int64_t step_of_name(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return -1;
  name.remove_prefix(kStepPrefix.size());
  int64_t step = -1;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc() || end != name.data() + name.size() || name.empty() || step < 0) return -1;
  return step;
}

void remove_all_checked(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  EXPAR_CHECK(!ec, "{}: cannot remove: {}: check the directory's permissions", p.string(), ec.message());
}

}  // namespace

std::string checkpoint_step_name(int64_t step) {
  return std::string(kStepPrefix) + std::to_string(step);
}

bool holds_checkpoint(const fs::path& dir) {
  return fs::exists(dir / kLatest) || fs::exists(dir / "manifest.json");
}

fs::path resolve_checkpoint_dir(const fs::path& dir) {
  const fs::path latest = dir / kLatest;
  if (fs::exists(latest)) {
    std::string name = read_text_file(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    EXPAR_CHECK(step_of_name(name) >= 0,
                "{}: names \"{}\", not a step directory (step-<N>): the file is damaged; write the newest "
                "complete step-<N> into it",
                latest.string(), text_excerpt(name));
    const fs::path step_dir = dir / name;
    EXPAR_CHECK(fs::exists(step_dir / "manifest.json"),
                "{}: names {}, which holds no manifest.json: the checkpoint was removed or damaged; point "
                "latest at a complete step directory",
                latest.string(), name);
    return step_dir;
  }
  EXPAR_CHECK(fs::exists(dir / "manifest.json"),
              "checkpoint '{}' holds neither a latest pointer nor manifest.json: pass a directory written by "
              "expar train --checkpoint (or one of its step-<N> directories)",
              dir.string());
  return dir;
}

void check_checkpoint_dir_writable(const fs::path& dir, const std::string& flag) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  EXPAR_CHECK(!ec, "{} '{}': cannot create the directory: {}: pass a writable directory", flag, dir.string(),
              ec.message());
  static std::atomic<int> counter{0};  // ranks may be threads of one process
  const fs::path probe = dir / fmt::format(".write-probe{}-{}", ::getpid(), counter++);
  std::ofstream out(probe);
  const int err = errno;
  const bool ok = out.good();
  out.close();
  fs::remove(probe, ec);
  EXPAR_CHECK(ok, "{} '{}': cannot create a file in it: {}: pass a writable directory", flag, dir.string(),
              std::strerror(err));
}

std::vector<int64_t> checkpoint_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  if (!fs::is_directory(dir)) return steps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

fs::path checkpoint_staging_dir(const fs::path& dir, int64_t step) {
  return dir / (checkpoint_step_name(step) + std::string(kPartialSuffix));
}

fs::path begin_checkpoint_save(const fs::path& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  EXPAR_CHECK(!ec, "checkpoint '{}': cannot create the directory: {}", dir.string(), ec.message());
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool crashed_save = name.ends_with(kPartialSuffix);
    const bool crashed_pointer = name.starts_with(std::string(kLatest) + ".tmp");
    if (crashed_save || crashed_pointer) remove_all_checked(entry.path());
  }
  const fs::path staging = checkpoint_staging_dir(dir, step);
  fs::create_directory(staging, ec);
  EXPAR_CHECK(!ec, "checkpoint '{}': cannot create {}: {}", dir.string(), staging.string(), ec.message());
  return staging;
}

void commit_checkpoint_save(const fs::path& dir, int64_t step, int keep_last, bool remove_others) {
  const std::string name = checkpoint_step_name(step);
  const fs::path staging = checkpoint_staging_dir(dir, step);
  const fs::path final_dir = dir / name;
  fsync_path(staging);
  std::error_code ec;
  if (fs::exists(final_dir)) {
    // A save of the same step (a resumed run saving again): `latest` may name it, so it is moved aside, not
    // removed, until the new one is in place.
    const fs::path old = dir / (name + ".replaced" + std::string(kPartialSuffix));
    remove_all_checked(old);
    fs::rename(final_dir, old, ec);
    EXPAR_CHECK(!ec, "{}: cannot move the older save aside: {}", final_dir.string(), ec.message());
  }
  fs::rename(staging, final_dir, ec);
  EXPAR_CHECK(!ec, "{}: cannot rename the finished checkpoint into place: {}", final_dir.string(),
              ec.message());
  fsync_path(dir);
  write_file_atomically(dir / kLatest, name + "\n");
  remove_all_checked(dir / (name + ".replaced" + std::string(kPartialSuffix)));
  if (!remove_others && keep_last <= 0) return;
  // Kept: the one just written and, unless every other goes, the newest keep_last - 1 others by step.
  const std::vector<int64_t> steps = checkpoint_steps(dir);
  int64_t others_kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it == step) continue;
    if (!remove_others && others_kept < keep_last - 1) {
      ++others_kept;
      continue;
    }
    remove_all_checked(dir / checkpoint_step_name(*it));
  }
}

void check_checkpoint_file_identity(const std::map<std::string, std::string>& metadata,
                                    const std::string& file, const CheckpointIdentity& expected,
                                    const std::string& manifest) {
  auto field = [&](const char* key) {
    auto it = metadata.find(key);
    return it == metadata.end() ? std::string("(none)") : it->second;
  };
  const std::string step = field("step");
  // Files of the format without save ids written by hand (tools, tests) may carry no step at all.
  const bool unnamed_old_file = expected.save_id.empty() && !metadata.contains("step");
  EXPAR_CHECK(
      unnamed_old_file || step == std::to_string(expected.step),
      "torn checkpoint: {} belongs to step {} but {} to step {}: the files come from different saves; "
      "use a complete step directory (expar train writes each save to its own step-<N>)",
      file, step, manifest, expected.step);
  if (!expected.save_id.empty())
    EXPAR_CHECK(
        field("save_id") == expected.save_id,
        "torn checkpoint: {} belongs to save {} but {} to save {} (both step {}): the files come from "
        "different saves; use a complete step directory",
        file, field("save_id"), manifest, expected.save_id, expected.step);
  if (!expected.model_hash.empty())
    EXPAR_CHECK(field("model_hash") == expected.model_hash,
                "{} was written for a model config with hash {}, but {} describes a model with hash {}: the "
                "manifest's model config does not describe these files (edited or replaced); restore the "
                "manifest written with them",
                file, field("model_hash"), manifest, expected.model_hash);
}

std::string new_save_id() {
  std::random_device device;
  const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", id);
}

std::string stable_hash(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

bool is_name_inside_directory(const std::string& file) {
  const fs::path p(file);
  bool escapes = file.empty() || p.is_absolute() || p.has_root_path();
  for (const auto& part : p) escapes = escapes || part == "..";
  return !escapes;
}

}  // namespace expar
