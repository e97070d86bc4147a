#include "expar/io/tokenizer/bpe.hpp"

#include <algorithm>

#include "expar/core/error.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/io/tokenizer/byte_level.hpp"
#include "expar/io/tokenizer/json_fields.hpp"
#include "expar/io/tokenizer/utf8.hpp"

namespace expar::tok {

namespace {

constexpr size_t kCacheMaxWords = 1 << 19;
constexpr size_t kCacheMaxWordBytes = 256;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: spreads pair keys over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string byte_token(unsigned b) {
  return fmt::format("<0x{:02X}>", b);
}

// A merge of the file: "left right" (older files) or ["left", "right"] (newer ones, which allow spaces).
std::pair<std::string, std::string> merge_parts(const nlohmann::json& merge, size_t index) {
  if (merge.is_string()) {
    const auto& s = merge.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    EXPAR_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size(),
                "tokenizer.json: merge {} {} is not \"left right\": each merge joins two tokens", index,
                json_excerpt(merge));
    return {s.substr(0, space), s.substr(space + 1)};
  }
  EXPAR_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
              "tokenizer.json: merge {} {} is neither \"left right\" nor [\"left\", \"right\"]", index,
              json_excerpt(merge));
  return {merge[0].get<std::string>(), merge[1].get<std::string>()};
}

}  // namespace

Bpe::Bpe(const nlohmann::json& model, bool byte_level) : byte_level_(byte_level) {
  const char* what = "model BPE";
  EXPAR_CHECK(model.contains("vocab") && model["vocab"].is_object(),
              "tokenizer.json: model BPE has no \"vocab\" object of token -> id");
  EXPAR_CHECK(model.contains("merges") && model["merges"].is_array(),
              "tokenizer.json: model BPE has no \"merges\" array");
  const double dropout = field_or(model, "dropout", 0.0, what);
  EXPAR_CHECK(
      dropout == 0.0,
      "tokenizer.json: model BPE dropout={} is not supported (dropout samples segmentations at random; "
      "inference tokenizers use null)",
      dropout);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string affix = field_or<std::string>(model, key, "", what);
    EXPAR_CHECK(affix.empty(), "tokenizer.json: model BPE {}={:?} is not supported (supported: null or \"\")",
                key, affix);
  }
  ignore_merges_ = field_or(model, "ignore_merges", false, what);
  byte_fallback_ = field_or(model, "byte_fallback", false, what);
  fuse_unk_ = field_or(model, "fuse_unk", false, what);
  unk_token_ = field_or<std::string>(model, "unk_token", "", what);

  for (const auto& [token, id] : model["vocab"].items()) {
    EXPAR_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
                "tokenizer.json: vocab entry {:?} has id {}: ids are integers in [0, 2^31)", token,
                json_excerpt(id));
    vocab_.emplace(token, id.get<int32_t>());
  }
  if (byte_level_) {
    // Tokens holding code points outside GPT-2's table cannot come out of a byte-level word; they stay in
    // vocab_ (for token_to_id and decoding) but not among the symbols.
    for (const auto& [token, id] : vocab_)
      if (auto bytes = byte_level_to_bytes(token)) symbols_.emplace(std::move(*bytes), id);
  } else {
    symbols_ = vocab_;
  }
  if (!unk_token_.empty()) {
    unk_id_ = token_to_id(unk_token_);
    EXPAR_CHECK(unk_id_ >= 0,
                "tokenizer.json: model BPE unk_token {:?} is not in the vocab: add it or set null",
                unk_token_);
  }
  for (unsigned b = 0; b < 256; ++b) {
    if (byte_level_) {
      byte_ids_[b] = find_id(symbols_, std::string_view(reinterpret_cast<const char*>(&b), 1));
      EXPAR_CHECK(byte_ids_[b] >= 0,
                  "tokenizer.json: byte-level model BPE has no token for byte 0x{:02X} (spelled {:?}): a "
                  "byte-level vocabulary holds all 256 bytes",
                  b, bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    } else {
      byte_ids_[b] = byte_fallback_ ? token_to_id(byte_token(b)) : -1;
    }
  }

  const auto& merges = model["merges"];
  size_t slots = 16;
  while (slots < merges.size() * 2) slots *= 2;
  merges_.assign(slots, MergeEntry{});
  merge_mask_ = slots - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto [left, right] = merge_parts(merges[rank], rank);
    const auto spelled = [&](const std::string& s) {
      if (!byte_level_) return s;
      auto bytes = byte_level_to_bytes(s);
      EXPAR_CHECK(bytes.has_value(), "tokenizer.json: merge {} has {:?}, which is not in byte-level spelling",
                  rank, s);
      return *bytes;
    };
    const std::string l = spelled(left), r = spelled(right);
    const int32_t left_id = find_id(symbols_, l), right_id = find_id(symbols_, r),
                  merged_id = find_id(symbols_, l + r);
    EXPAR_CHECK(left_id >= 0 && right_id >= 0 && merged_id >= 0,
                "tokenizer.json: merge {} ({:?} + {:?}) names a token that is not in the vocab ({:?}): every "
                "merge joins two vocab tokens into a third",
                rank, left, right,
                left_id < 0    ? left
                : right_id < 0 ? right
                               : left + right);
    // A pair listed twice keeps its first (lowest) rank, as the reference implementations do.
    if (!find_merge(left_id, right_id)) add_merge(left_id, right_id, static_cast<int32_t>(rank), merged_id);
  }
}

const Bpe::MergeEntry* Bpe::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeEntry& e = merges_[slot];
    if (e.key == key) return &e;
    if (e.key == ~uint64_t{0}) return nullptr;
  }
}

void Bpe::add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  const uint64_t key = pair_key(left, right);
  uint64_t slot = mix(key) & merge_mask_;
  while (merges_[slot].key != ~uint64_t{0}) slot = (slot + 1) & merge_mask_;
  merges_[slot] = MergeEntry{key, rank, merged};
}

void Bpe::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  symbols.clear();
  if (byte_level_) {
    for (unsigned char b : word) symbols.push_back(byte_ids_[b]);
    return;
  }
  bool previous_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    next_code_point(word, i);
    const std::string_view ch = word.substr(start, i - start);
    if (const int32_t id = find_id(symbols_, ch); id >= 0) {
      symbols.push_back(id);
      previous_unk = false;
      continue;
    }
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      previous_unk = false;
      continue;
    }
    EXPAR_CHECK(
        unk_id_ >= 0,
        "tokenizer: {:?} (in the word {:?}) is not in the vocabulary, and the model has no unk_token or "
        "byte fallback to stand for it",
        std::string(ch), std::string(word.substr(0, 64)));
    if (!(fuse_unk_ && previous_unk)) symbols.push_back(unk_id_);
    previous_unk = true;
  }
}

void Bpe::merge(std::vector<int32_t>& ids) const {
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  struct Candidate {
    int32_t rank, pos, left, right, merged;
  };
  // Lowest rank first; equal ranks: leftmost first (the order of both reference implementations).
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<Candidate> heap;
  prev.resize(static_cast<size_t>(n));
  next.resize(static_cast<size_t>(n));
  heap.clear();
  const auto consider = [&](int32_t pos, int32_t right_pos) {
    if (const MergeEntry* m = find_merge(ids[pos], ids[right_pos])) {
      heap.push_back({m->rank, pos, ids[pos], ids[right_pos], m->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    const int32_t right = next[c.pos];
    // Stale candidates (a side was merged since it was queued) no longer match the current ids.
    if (ids[c.pos] != c.left || right < 0 || ids[right] != c.right) continue;
    ids[c.pos] = c.merged;
    ids[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    if (prev[c.pos] >= 0) consider(prev[c.pos], c.pos);
    if (next[c.pos] >= 0) consider(c.pos, next[c.pos]);
  }
  int32_t kept = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) ids[kept++] = ids[i];
  ids.resize(static_cast<size_t>(kept));
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out, bool use_cache) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t id = find_id(symbols_, word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  use_cache = use_cache && word.size() < kCacheMaxWordBytes;
  if (use_cache) {
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), cache_ids_.begin() + it->second.offset,
                 cache_ids_.begin() + it->second.offset + it->second.length);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  initial_symbols(word, symbols);
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (use_cache) {
    if (cache_.size() >= kCacheMaxWords) {
      cache_.clear();
      cache_ids_.clear();
    }
    cache_.emplace(std::string(word), CacheEntry{static_cast<uint32_t>(cache_ids_.size()),
                                                 static_cast<uint32_t>(symbols.size())});
    cache_ids_.insert(cache_ids_.end(), symbols.begin(), symbols.end());
  }
}

}  // namespace expar::tok
