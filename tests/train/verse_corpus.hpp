#pragma once
// The corpus of the training tests that need only enough tokens for the tiny model's batches: one verse
// repeated (the same bytes every run), built once per process.
#include <string>

#include "expar/train/trainer.hpp"

namespace expar::testing {

inline const TokenCorpus& genesis_corpus() {
  static const TokenCorpus c = [] {
    std::string text;
    for (int i = 0; i < 100; ++i) text += "In the beginning God created the heaven and the earth. ";
    return TokenCorpus::from_text(text);
  }();
  return c;
}

}  // namespace expar::testing
