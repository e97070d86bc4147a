// expar::Tokenizer::encode from several threads at once: one encoder at a time uses the word cache and the
// others run without it, so every thread must get the ids of a single-threaded encode (and ThreadSanitizer,
// which runs this file, must see no race on the cache or the regex match data).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "expar/io/tokenizer.hpp"
#include "expar/io/tokenizer/byte_level.hpp"

namespace expar {
namespace {

// A byte-level vocabulary (GPT-2's pre-tokenizer and decoder): the 256 bytes and a few merges.
Tokenizer byte_level_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {" ", "the"}, {"e", "r"}, {" ", "t"}, {"i", "n"}, {"in", "g"}, {"o", "n"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    const std::string left = tok::bytes_to_byte_level(l), right = tok::bytes_to_byte_level(r);
    vocab[left + right] = id++;
    merge_list.push_back(left + " " + right);
  }
  const nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  return Tokenizer(j.dump(), "", "byte-level test tokenizer");
}

TEST(TokenizerThreads, ConcurrentEncodesMatchASingleThread) {
  const Tokenizer t = byte_level_tokenizer();
  std::vector<std::string> texts;
  for (int k = 0; k < 40; ++k)
    texts.push_back("the other thing " + std::to_string(k) + " on the ring, 你好 théâtre\n  spacing " +
                    std::string(static_cast<size_t>(k % 7), 'x'));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& s : texts) expected.push_back(t.encode(s));
  EXPECT_EQ(t.decode(expected[3]), texts[3]);
  EXPECT_LT(expected[0].size(), texts[0].size());  // merges happened

  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 25; ++rep)
        for (size_t k = 0; k < texts.size(); ++k)
          if (t.encode(texts[(k + static_cast<size_t>(w)) % texts.size()]) !=
              expected[(k + static_cast<size_t>(w)) % texts.size()])
            ++mismatches[static_cast<size_t>(w)];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace expar
