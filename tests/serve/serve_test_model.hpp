#pragma once
// A small random MoE checkpoint (our format) shared by the serve tests, written once per test binary.
#include <map>
#include <mutex>

#include "infer/infer_test_util.hpp"

namespace expar::serve::testing {

// max_seq: the context (a long one lets a test keep a stream running for a while).
inline std::filesystem::path serve_test_model(int64_t max_seq = 64) {
  static std::map<int64_t, std::filesystem::path> dirs;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto it = dirs.find(max_seq);
  if (it != dirs.end()) return it->second;
  const std::filesystem::path dir = [max_seq] {
    std::filesystem::path d = infer::testing::temp_dir("serve_" + std::to_string(max_seq));
    ModelConfig c = infer::testing::test_config();
    c.max_seq = max_seq;
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(c, *group);
      model.init(5);
      infer::testing::write_expar_checkpoint(d, model, 4);
    });
    return d;
  }();
  dirs[max_seq] = dir;
  return dir;
}

}  // namespace expar::serve::testing
