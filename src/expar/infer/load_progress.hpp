#pragma once
// How far the loading of weights has come, for a person watching a real-size checkpoint load (a minute or
// more). load_rank_weights adds each layer's bytes as the layer is complete, and the embedding and LM head
// before the layers; the command that loads shows the counts (cli/load_report.hpp). One process-wide
// counter: every rank of the threads transport adds to it.
#include <atomic>
#include <cstdint>

namespace expar::infer {

struct LoadProgress {
  std::atomic<int64_t> bytes{0};  // weight bytes copied (or mapped) so far, over the ranks of this process
  std::atomic<int64_t> parts{0};  // layers (and the embedding/LM head) complete, over the ranks
  void reset() {
    bytes = 0;
    parts = 0;
  }
};

LoadProgress& load_progress();

}  // namespace expar::infer
