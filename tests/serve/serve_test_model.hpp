#pragma once
// A small random MoE checkpoint (our format) shared by the serve tests, written once per test binary.
#include "infer/infer_test_util.hpp"

namespace expar::serve::testing {

inline const std::filesystem::path& serve_test_model() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = infer::testing::temp_dir("serve");
    ModelConfig c = infer::testing::test_config();
    c.max_seq = 64;
    run_ranks(1, [&](Comm& world) {
      auto group = world.split(0, 0, "ep");
      MoeTransformer model(c, *group);
      model.init(5);
      infer::testing::write_expar_checkpoint(d, model, 4);
    });
    return d;
  }();
  return dir;
}

}  // namespace expar::serve::testing
