#pragma once
// tokenizer.json's "model" of type BPE: merges applied lowest rank first (ties: leftmost), over symbols
// that are token ids. For byte-level vocabularies the symbols start as the 256 bytes of the word (vocab
// entries are converted from GPT-2's byte spelling to raw bytes on load, so encoding never builds the
// spelled string); for SentencePiece-style vocabularies they start as the word's code points, with
// <0xXX> byte tokens for code points not in the vocabulary (byte_fallback) or the unknown token.
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "expar/io/tokenizer/string_map.hpp"

namespace expar::tok {

class Bpe {
 public:
  // `byte_level`: the pre-tokenizer maps text to GPT-2's byte spelling, so words arrive as raw bytes.
  Bpe(const nlohmann::json& model, bool byte_level);

  // Appends the ids of one pre-tokenized word. `use_cache`: look up and store whole-word results (the
  // caller holds cache_mutex()).
  void encode_word(std::string_view word, std::vector<int32_t>& out, bool use_cache) const;

  // The vocabulary as the file spells it.
  int32_t token_to_id(std::string_view token) const { return find_id(vocab_, token); }
  const TokenIdMap& vocab() const { return vocab_; }
  int32_t unk_id() const { return unk_id_; }
  bool byte_level() const { return byte_level_; }
  std::mutex& cache_mutex() const { return cache_mutex_; }

 private:
  struct MergeEntry {
    uint64_t key = ~uint64_t{0};  // (left id << 32) | right id; all ones: empty slot
    int32_t rank = 0;
    int32_t merged = 0;
  };
  const MergeEntry* find_merge(int32_t left, int32_t right) const;
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged);
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;

  bool byte_level_;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_id_ = -1;
  std::string unk_token_;
  TokenIdMap vocab_;       // spelled as in the file
  TokenIdMap symbols_;     // spelled as words arrive: raw bytes for byte-level vocabularies, else = vocab_
  int32_t byte_ids_[256];  // byte-level: the token of each byte; byte_fallback: <0xXX>; -1: none
  std::vector<MergeEntry> merges_;  // open addressing, power-of-two size
  uint64_t merge_mask_ = 0;

  // Whole-word results: most words of a text repeat, so the merge loop runs once per distinct word.
  struct CacheEntry {
    uint32_t offset, length;
  };
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, CacheEntry, StringHash, std::equal_to<>> cache_;
  mutable std::vector<int32_t> cache_ids_;
};

}  // namespace expar::tok
