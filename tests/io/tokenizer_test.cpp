// Unit tests of expar::Tokenizer's pieces on small hand-made tokenizer.json files: BPE merge order, byte
// fallback, added-token flags (lstrip/rstrip/single_word, normalized), post-processor, decoders, and the
// errors for unsupported components and bad input.
#include "expar/io/tokenizer.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "expar/core/error.hpp"

namespace expar {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A SentencePiece-style vocabulary over a, b, c with merges in the given order.
json spm(json merges, json added = json::array()) {
  return {{"model",
           {{"type", "BPE"},
            {"vocab",
             {{"<unk>", 0},
              {"a", 1},
              {"b", 2},
              {"c", 3},
              {"ab", 4},
              {"bc", 5},
              {"abc", 6},
              {"<0x41>", 7},
              {"▁", 8},
              {"▁a", 9}}},
            {"merges", merges},
            {"unk_token", "<unk>"},
            {"byte_fallback", true}}},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr}};
}

Tokenizer make(const json& j) {
  return Tokenizer(j.dump(), "", "test tokenizer.json");
}

TEST(Bpe, LowerRankMergesFirst) {
  // "abc": with "a b" ranked first -> ab + c -> abc (merge "ab c"); with "b c" first -> a + bc -> abc via "a
  // bc".
  EXPECT_EQ(make(spm({"a b", "ab c"})).encode("abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(make(spm({"b c", "a b"})).encode("abc"), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(make(spm({"a b", "b c"})).encode("abc"), (std::vector<int32_t>{4, 3}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  // Two places where the same merge applies: both merge ("abab"); overlapping ones go leftmost first ("aaa").
  EXPECT_EQ(make(spm({"a b"})).encode("abab"), (std::vector<int32_t>{4, 4}));
  json j = spm({"a a"});
  j["model"]["vocab"]["aa"] = 10;
  EXPECT_EQ(make(j).encode("aaa"), (std::vector<int32_t>{10, 1}));  // (aa)a, not a(aa)
}

TEST(Bpe, ByteFallbackAndUnknown) {
  // 'A' is not in the vocab but its byte token <0x41> is; 'Z' has neither, so it is <unk>.
  EXPECT_EQ(make(spm(json::array())).encode("aAZ"), (std::vector<int32_t>{1, 7, 0}));
  EXPECT_EQ(make(spm(json::array())).decode(std::vector<int32_t>{1, 7}),
            "a <0x41>");  // no decoder: tokens joined by spaces
}

TEST(AddedTokens, MatchedBeforeSplittingLongestFirst) {
  const json added = json::array({{{"id", 20}, {"content", "<x>"}, {"special", true}},
                                  {{"id", 21}, {"content", "<x>y"}, {"special", false}}});
  const Tokenizer t = make(spm({"a b"}, added));
  EXPECT_EQ(t.encode("ab<x>ab<x>yc"), (std::vector<int32_t>{4, 20, 4, 21, 3}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{20, 21}, /*skip_special_tokens=*/true), "<x>y");
  EXPECT_TRUE(t.is_special(20));
  EXPECT_FALSE(t.is_special(21));
}

TEST(AddedTokens, LstripAndRstripTakeTheWhitespaceBesideThem) {
  json j = spm(json::array());
  j["model"]["vocab"][" "] = 11;
  j["added_tokens"] = json::array({{{"id", 20}, {"content", "<l>"}, {"special", true}, {"lstrip", true}},
                                   {{"id", 21}, {"content", "<r>"}, {"special", true}, {"rstrip", true}}});
  const Tokenizer t = make(j);
  EXPECT_EQ(t.encode("a  <l> a"), (std::vector<int32_t>{1, 20, 11, 1}));
  EXPECT_EQ(t.encode("a <r>  a"), (std::vector<int32_t>{1, 11, 21, 1}));
}

TEST(AddedTokens, SingleWordOnlyOutsideWords) {
  json j = spm(json::array());
  j["model"]["vocab"][" "] = 11;
  j["added_tokens"] =
      json::array({{{"id", 20}, {"content", "b"}, {"single_word", true}, {"normalized", false}}});
  const Tokenizer t = make(j);
  EXPECT_EQ(t.encode("a b"), (std::vector<int32_t>{1, 11, 20}));
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{1, 2, 3}));  // inside a word: plain text
}

TEST(Normalizers, PrependReplaceAndTemplateProcessing) {
  json j = spm({"▁ a"});
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "▁"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  j["model"]["vocab"]["<s>"] = 12;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {12}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  const Tokenizer t = make(j);
  EXPECT_EQ(t.encode("a a"), (std::vector<int32_t>{12, 9, 9}));
  EXPECT_EQ(t.encode("a a", /*add_special_tokens=*/false), (std::vector<int32_t>{9, 9}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{9, 9, 7}), "a aA");
}

TEST(Errors, UnsupportedComponentsAreNamed) {
  json j = spm(json::array());
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  try {
    make(j);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("pre_tokenizer type \"Whitespace\" is not supported (supported: "));
  }
  j = spm(json::array());
  j["model"]["type"] = "Unigram";
  EXPECT_THROW(make(j), Error);
  j = spm(json::array());
  j["decoder"] = {{"type", "WordPiece"}};
  try {
    make(j);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("decoder type \"WordPiece\" is not supported"));
  }
}

TEST(Errors, BadMergesRegexesAndInput) {
  try {
    make(spm({"a z"}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("merge 0"));
    EXPECT_THAT(e.what(), HasSubstr("not in the vocab"));
  }
  json j = spm(json::array());
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  try {
    make(j);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not compile"));
  }
  const Tokenizer t = make(spm(json::array()));
  try {
    t.encode("a\xff");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("byte 1 (0xFF)"));
  }
  EXPECT_THROW(t.decode(std::vector<int32_t>{999}), Error);
  EXPECT_THROW(make(json{{"model", {{"type", "BPE"}}}}), Error);
  EXPECT_THROW(Tokenizer("{not json", "", "x"), Error);
}

}  // namespace
}  // namespace expar
