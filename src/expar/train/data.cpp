#include "expar/train/data.hpp"

#include <fstream>
#include <iterator>

#include "expar/core/error.hpp"
#include "expar/core/rng.hpp"

namespace expar {

ByteCorpus ByteCorpus::from_text(std::string text, double validation_fraction) {
  EXPAR_CHECK(validation_fraction > 0 && validation_fraction < 1,
              "validation fraction {} must lie in (0, 1), e.g. 0.05", validation_fraction);
  ByteCorpus c;
  auto split = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - validation_fraction));
  c.train_.assign(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(split));
  c.validation_.assign(text.begin() + static_cast<std::ptrdiff_t>(split), text.end());
  return c;
}

ByteCorpus ByteCorpus::load(const std::string& path, double validation_fraction) {
  std::ifstream in(path, std::ios::binary);
  EXPAR_CHECK(in.good(), "cannot read the corpus '{}': pass --data with an existing text file", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPAR_CHECK(text.size() >= 4096, "corpus '{}' has {} bytes: use a text of at least 4096 bytes", path,
              text.size());
  return from_text(std::move(text), validation_fraction);
}

namespace {
void copy_window(const std::vector<uint8_t>& bytes, size_t start, int seq_len, TokenBatch& batch) {
  for (int j = 0; j < seq_len; ++j) {
    batch.inputs.push_back(bytes[start + static_cast<size_t>(j)]);
    batch.targets.push_back(bytes[start + static_cast<size_t>(j) + 1]);
  }
}
constexpr uint64_t kDataStream = 0xDA7A;
}  // namespace

TokenBatch training_batch(const ByteCorpus& corpus, uint64_t seed, int64_t step, int global_batch, int first,
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

TokenBatch validation_batch(const ByteCorpus& corpus, int total, int first, int count, int seq_len) {
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

}  // namespace expar
