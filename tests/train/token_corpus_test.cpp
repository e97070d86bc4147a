// TokenCorpus: text and token files split into training and validation parts as before; a token not below
// the model's vocabulary is an error naming its index in the file and its value.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.hpp"
#include "expar/core/error.hpp"
#include "expar/train/data.hpp"

namespace expar {
namespace {

namespace fs = std::filesystem;

TEST(TokenCorpus, TokenFileSplitsLikeText) {
  const test::TempDir dir("corpus");
  std::string bytes;
  for (int i = 0; i < 100; ++i) bytes += std::string{static_cast<char>(i), 0};  // uint16 0..99
  std::ofstream(dir / "t.bin", std::ios::binary) << bytes;
  std::ofstream(dir / "t.bin.json") << R"({"dtype": "uint16", "vocab_size": 100})";
  const TokenCorpus c = TokenCorpus::load((dir / "t.bin").string());
  EXPECT_EQ(c.vocab(), 100);
  ASSERT_EQ(c.train().size(), 95u);
  ASSERT_EQ(c.validation().size(), 5u);
  EXPECT_EQ(c.train()[94], 94);
  EXPECT_EQ(c.validation()[0], 95);
  // The same split as text of the same length.
  const TokenCorpus t = TokenCorpus::from_text(std::string(100, 'a'));
  EXPECT_EQ(t.train().size(), 95u);
  EXPECT_NO_THROW(c.check_vocab(100));
  try {
    c.check_vocab(97);  // 97.. are in the validation split: the index is the file's
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("vocab_size 100"), std::string::npos) << m;
  }
  const TokenCorpus npy_like = TokenCorpus::from_tokens(c.train(), 0);  // no stated vocabulary
  try {
    npy_like.check_vocab(50);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("token 50"), std::string::npos) << m;
    EXPECT_NE(m.find("value 50"), std::string::npos) << m;
  }
  const TokenCorpus tail =
      TokenCorpus::from_tokens(std::vector<int32_t>(c.train().begin(), c.train().begin() + 50), 0);
  try {
    TokenCorpus::from_tokens(
        [] {
          std::vector<int32_t> v(100, 1);
          v[98] = 7;
          return v;
        }(),
        0)
        .check_vocab(5);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 98"), std::string::npos) << e.what();  // in validation
  }
  EXPECT_NO_THROW(tail.check_vocab(50));
  // Too small, and directories.
  std::ofstream(dir / "s.bin", std::ios::binary) << std::string(20, '\0');
  std::ofstream(dir / "s.bin.json") << R"({"dtype": "uint16", "vocab_size": 10})";
  EXPECT_THROW(TokenCorpus::load((dir / "s.bin").string()), Error);
  try {
    TokenCorpus::load(dir.path().string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace expar
