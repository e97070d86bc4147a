#pragma once
// Training data: a text file (its bytes, vocabulary 256) or a token file (io/token_file.hpp: little-endian
// uint16/uint32 with a FILE.json sidecar, or .npy). The corpus is split into a training part and a held-out
// tail for validation. Batches are a pure function of (seed, step): sequence i of the global batch of step s
// starts at a position drawn from the counter-based RNG at index s·global_batch + i, so every dense-DP rank
// reads its own slice of the same global batch whatever the layout, and resuming at step s needs no other
// state.
#include <cstdint>
#include <string>
#include <vector>

namespace expar {

class Tokenizer;

class TokenCorpus {
 public:
  // Throws expar::Error naming the path if it cannot be read (read_token_file's rules) or is too small (a
  // text of 4096 bytes, a token file of 64 tokens).
  // A text file is tokenized by `tokenizer` when given (else its bytes are the tokens).
  static TokenCorpus load(const std::string& path, double validation_fraction = 0.05,
                          const Tokenizer* tokenizer = nullptr);
  static TokenCorpus from_text(std::string text, double validation_fraction = 0.05);
  static TokenCorpus from_tokens(std::vector<int32_t> tokens, int64_t vocab,
                                 double validation_fraction = 0.05);

  const std::vector<int32_t>& train() const { return train_; }
  const std::vector<int32_t>& validation() const { return validation_; }
  // The vocabulary the data states (text: 256); 0: not stated (.npy).
  int64_t vocab() const { return vocab_; }
  // Throws expar::Error naming the split, index and value of the first token not below `model_vocab`.
  void check_vocab(int64_t model_vocab) const;

 private:
  std::vector<int32_t> train_, validation_;
  int64_t vocab_ = 0;
  std::string label_;
};

struct TokenBatch {
  int sequences = 0, seq_len = 0;
  std::vector<int32_t> inputs;   // [sequences * seq_len]
  std::vector<int32_t> targets;  // [sequences * seq_len], the next byte of each input
};

// Sequences [first, first + count) of the global batch of `step` from the training split.
TokenBatch training_batch(const TokenCorpus& corpus, uint64_t seed, int64_t step, int global_batch, int first,
                          int count, int seq_len);
// Context parallelism: positions [chunk·S/chunks, (chunk+1)·S/chunks) of every sequence of `batch`
// (inputs and their targets alike). S must be divisible by `chunks`.
TokenBatch sequence_chunk(const TokenBatch& batch, int chunk, int chunks);
// Validation sequences [first, first + count) of `total` evenly spaced windows of the validation split.
TokenBatch validation_batch(const TokenCorpus& corpus, int total, int first, int count, int seq_len);

}  // namespace expar
