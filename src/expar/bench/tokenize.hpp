#pragma once
// What `expar bench tokenize` measures: encode throughput (MB/s of UTF-8 text) of expar::Tokenizer beside
// @huggingface/tokenizers (node, tests/io/reference/reference.mjs) on the same text in the same run, each the
// median of `repeats` encodes of the whole text after one warm-up; the token counts must agree, or the speeds
// are not comparable and it throws.
#include <cstddef>
#include <filesystem>
#include <string>

namespace expar::bench {

// Generated text: words drawn with a Zipf-like law from 60,000 made-up words (Latin, Cyrillic and CJK
// syllables), with digits, punctuation, code-like lines and newlines, so that most words repeat (as in real
// text) while the word cache still sees many distinct ones. A pure function of `bytes`.
std::string zipf_text(size_t bytes);

struct TokenizeSpeed {
  size_t text_bytes = 0;
  size_t tokens = 0, reference_tokens = 0;
  double mb_per_s = 0, reference_mb_per_s = 0;
};

// `tokenizer`: tokenizer.json or a directory holding it; `reference`: the folder of reference.mjs and its
// node_modules; `text_path`: the file holding `text` (node reads it).
TokenizeSpeed measure_tokenize(const std::filesystem::path& tokenizer, const std::string& text,
                               const std::filesystem::path& text_path, const std::filesystem::path& reference,
                               int repeats);

}  // namespace expar::bench
