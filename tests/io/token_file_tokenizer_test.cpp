// Text data through a checkpoint's tokenizer (expar eval --data on a text file when the checkpoint has a
// tokenizer.json): the tokens are the tokenizer's encoding of the whole file, with its special tokens, and
// the stated vocabulary is the tokenizer's; without a tokenizer the bytes stay the tokens.
#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/io/token_file.hpp"
#include "expar/io/tokenizer.hpp"
#include "tokenizer_reference_util.hpp"

namespace expar {
namespace {

TEST(TokenFileTokenizer, TextGoesThroughTheTokenizer) {
  const std::string missing = test::missing_reference_packages();
  ASSERT_TRUE(missing.empty()) << missing;
  const test::TempDir dir("token_file_tokenizer");
  const auto path = dir / "text.txt";
  const std::string text =
      "In the beginning God created the heaven and the earth.\n  Und die Erde war wüst, 世界!";
  std::ofstream(path) << text;
  const Tokenizer tokenizer = Tokenizer::from_path(test::vocabulary_dir("llama2"));
  const TokenFile f = read_token_file(path, &tokenizer);
  EXPECT_EQ(f.tokens, tokenizer.encode(text, true));
  EXPECT_EQ(f.tokens.front(), *tokenizer.token_to_id("<s>")) << "the post-processor's BOS";
  EXPECT_EQ(f.vocab, tokenizer.vocab_size());
  EXPECT_LT(f.tokens.size(), text.size());
  const TokenFile bytes = read_token_file(path);
  EXPECT_EQ(bytes.tokens.size(), text.size());
  EXPECT_EQ(bytes.vocab, 256);
}

}  // namespace
}  // namespace expar
