#pragma once
// Token files: what `expar train --data` and `expar eval --data` read.
//
//  text      any other file: its bytes are the tokens (vocabulary 256, the byte-level model's), or, given a
//            tokenizer (a checkpoint's tokenizer.json), its ids as the tokenizer encodes the whole text
//  raw       little-endian uint16 or uint32 tokens, with a sidecar FILE.json next to FILE:
//            {"dtype": "uint16" | "uint32", "vocab_size": V}; every token must be below V
//  .npy      a NumPy array (C order, any shape, flattened) of dtype uint8, uint16, uint32, int32 or int64 in
//            little-endian; no vocabulary is stated (the model's is checked against)
//
// Bad input gets an expar::Error naming the path and the rule: a directory, an unreadable file, a size that
// is not a whole number of tokens, a sidecar or .npy header that does not parse, a token that is negative or
// not below the stated vocabulary (naming its index and value).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace expar {

struct TokenFile {
  std::vector<int32_t> tokens;
  int64_t vocab = 0;  // the vocabulary the file states (text: 256, raw: the sidecar's); 0: not stated (.npy)
  std::string kind;   // "text", "uint16", "uint32", "npy <dtype>"
};

class Tokenizer;

// `tokenizer`: how a text file becomes tokens (nullptr: its bytes).
TokenFile read_token_file(const std::filesystem::path& path, const Tokenizer* tokenizer = nullptr);

// Throws expar::Error naming `label`, the first bad token's index (counted from `first_index`) and value
// unless every token is in [0, vocab).
void check_tokens_below(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& label,
                        size_t first_index = 0);

}  // namespace expar
