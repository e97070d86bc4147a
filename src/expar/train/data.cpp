#include "expar/train/data.hpp"

#include <fstream>
#include <iterator>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"
#include "expar/io/token_file.hpp"

namespace expar {

TokenCorpus TokenCorpus::from_tokens(std::vector<int32_t> tokens, int64_t vocab, double validation_fraction) {
  EXPAR_CHECK(validation_fraction > 0 && validation_fraction < 1,
              "validation fraction {} must lie in (0, 1), e.g. 0.05", validation_fraction);
  TokenCorpus c;
  c.vocab_ = vocab;
  c.label_ = "the corpus";
  auto split = static_cast<size_t>(static_cast<double>(tokens.size()) * (1.0 - validation_fraction));
  c.validation_.assign(tokens.begin() + static_cast<std::ptrdiff_t>(split), tokens.end());
  tokens.resize(split);
  c.train_ = std::move(tokens);
  return c;
}

TokenCorpus TokenCorpus::from_text(std::string text, double validation_fraction) {
  std::vector<int32_t> tokens(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  return from_tokens(std::move(tokens), 256, validation_fraction);
}

TokenCorpus TokenCorpus::load(const std::string& path, double validation_fraction,
                              const Tokenizer* tokenizer) {
  TokenFile f = read_token_file(path, tokenizer);
  if (f.kind == "text") {
    EXPAR_CHECK(f.tokens.size() >= 4096, "corpus '{}' has {} bytes: use a text of at least 4096 bytes", path,
                f.tokens.size());
  } else {
    EXPAR_CHECK(f.tokens.size() >= 64, "token file '{}' holds {} tokens: use at least 64", path,
                f.tokens.size());
  }
  TokenCorpus c = from_tokens(std::move(f.tokens), f.vocab, validation_fraction);
  c.label_ = "'" + path + "' (" + f.kind + ")";
  return c;
}

void TokenCorpus::check_vocab(int64_t model_vocab) const {
  EXPAR_CHECK(vocab_ == 0 || vocab_ <= model_vocab,
              "{} states vocab_size {} but the model's vocabulary is {}: use data tokenised for this model",
              label_, vocab_, model_vocab);
  check_tokens_below(train_, model_vocab, label_);
  check_tokens_below(validation_, model_vocab, label_, train_.size());
}

namespace {
void copy_window(const std::vector<int32_t>& bytes, size_t start, int seq_len, TokenBatch& batch) {
  for (int j = 0; j < seq_len; ++j) {
    batch.inputs.push_back(bytes[start + static_cast<size_t>(j)]);
    batch.targets.push_back(bytes[start + static_cast<size_t>(j) + 1]);
  }
}
constexpr uint64_t kDataStream = 0xDA7A;
}  // namespace

TokenBatch training_batch(const TokenCorpus& corpus, uint64_t seed, int64_t step, int global_batch, int first,
                          int count, int seq_len) {
  const auto& bytes = corpus.train();
  EXPAR_CHECK(bytes.size() > static_cast<size_t>(seq_len) + 1,
              "training split of {} bytes is shorter than seq_len+1={}: use a shorter --seq-len",
              bytes.size(), seq_len + 1);
  TokenBatch batch{count, seq_len, {}, {}};
  const uint64_t positions = bytes.size() - static_cast<size_t>(seq_len) - 1;
  for (int i = first; i < first + count; ++i) {
    uint64_t index =
        static_cast<uint64_t>(step) * static_cast<uint64_t>(global_batch) + static_cast<uint64_t>(i);
    uint64_t r = (static_cast<uint64_t>(random_u32(seed, kDataStream, 2 * index)) << 32) |
                 random_u32(seed, kDataStream, 2 * index + 1);
    copy_window(bytes, r % positions, seq_len, batch);
  }
  return batch;
}

TokenBatch validation_batch(const TokenCorpus& corpus, int total, int first, int count, int seq_len) {
  const auto& bytes = corpus.validation();
  EXPAR_CHECK(
      bytes.size() > static_cast<size_t>(seq_len) + 1,
      "validation split of {} bytes is shorter than seq_len+1={}: use a shorter --seq-len or a larger corpus",
      bytes.size(), seq_len + 1);
  TokenBatch batch{count, seq_len, {}, {}};
  const size_t span = bytes.size() - static_cast<size_t>(seq_len) - 1;
  for (int i = first; i < first + count; ++i)
    copy_window(bytes, span * static_cast<size_t>(i) / static_cast<size_t>(std::max(1, total)), seq_len,
                batch);
  return batch;
}

TokenBatch sequence_chunk(const TokenBatch& batch, int chunk, int chunks) {
  EXPAR_CHECK(
      chunks >= 1 && chunk >= 0 && chunk < chunks && batch.seq_len % chunks == 0,
      "sequence_chunk: chunk {} of {} of sequences of length {}: the chunk must lie in [0, chunks) and "
      "the length be divisible by the chunk count",
      chunk, chunks, batch.seq_len);
  const int len = batch.seq_len / chunks;
  TokenBatch out{batch.sequences, len, {}, {}};
  out.inputs.reserve(static_cast<size_t>(batch.sequences) * static_cast<size_t>(len));
  out.targets.reserve(out.inputs.capacity());
  for (int s = 0; s < batch.sequences; ++s) {
    const auto from = static_cast<ptrdiff_t>(s) * batch.seq_len + static_cast<ptrdiff_t>(chunk) * len;
    out.inputs.insert(out.inputs.end(), batch.inputs.begin() + from, batch.inputs.begin() + from + len);
    out.targets.insert(out.targets.end(), batch.targets.begin() + from, batch.targets.begin() + from + len);
  }
  return out;
}

}  // namespace expar
