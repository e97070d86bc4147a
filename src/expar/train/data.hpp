#pragma once
// Byte-level text data (vocabulary 256). The corpus is split into a training part and a held-out tail for
// validation. Batches are a pure function of (seed, step): sequence i of the global batch of step s starts
// at a position drawn from the counter-based RNG at index s·global_batch + i, so every dense-DP rank reads
// its own slice of the same global batch whatever the layout, and resuming at step s needs no other state.
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

class ByteCorpus {
 public:
  // Throws expar::Error naming the path if it cannot be read or is too small for `min_bytes`.
  static ByteCorpus load(const std::string& path, double validation_fraction = 0.05);
  static ByteCorpus from_text(std::string text, double validation_fraction = 0.05);

  const std::vector<uint8_t>& train() const { return train_; }
  const std::vector<uint8_t>& validation() const { return validation_; }

 private:
  std::vector<uint8_t> train_, validation_;
};

struct TokenBatch {
  int sequences = 0, seq_len = 0;
  std::vector<int32_t> inputs;   // [sequences * seq_len]
  std::vector<int32_t> targets;  // [sequences * seq_len], the next byte of each input
};

// Sequences [first, first + count) of the global batch of `step` from the training split.
TokenBatch training_batch(const ByteCorpus& corpus, uint64_t seed, int64_t step, int global_batch, int first,
                          int count, int seq_len);
// Validation sequences [first, first + count) of `total` evenly spaced windows of the validation split.
TokenBatch validation_batch(const ByteCorpus& corpus, int total, int first, int count, int seq_len);

}  // namespace expar
